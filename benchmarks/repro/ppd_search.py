"""Issue 15: which assumptions explain the PPD paper's turn-2 TTFTs (PD 143.7 ms, PPD ≈ 51 ms
at 1P3D, 1 QPS, its figure 5; x=1 −48% to −73%, its table 1; PPD −68% on average) where
``warmpath repro ppd`` gets ~15 / ~12 ms and −18%. Each set changes one or more of: how a
P→D handoff works (:class:`~warmpath.sim.handoff.PDHandoff`: TTFT at the decode worker's
first token, the P node recomputing the whole conversation, a fixed cost per handoff), the
router/HTTP time of every request, the engine's per-step overhead, the lengths (``ppd_grid``
scaled) and the NIC. Every point is x=0, x=1 and dynamic on the paper's 1P3D.

    python -m benchmarks.repro.ppd_search --sets base,vllm --rates 0.5,12 --duration 30 \\
        --out benchmarks/results/ppd_search.json

Resumable: rows already in ``--out`` are skipped; the JSON and a markdown table (``.md``)
are rewritten after every point.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from benchmarks.common.results import read_json, stored
from warmpath.bench.workload import ppd_grid
from warmpath.sim.handoff import PDHandoff
from warmpath.sim.repro import PPD_SPLITS, ppd_setup
from warmpath.sim.run import simulate_rate


@dataclass(frozen=True)
class Assume:
    """One assumption set: ``handoff`` (warmpath's by default), ``overhead_s`` per request
    (router + HTTP + proxy, both paths), ``step_overhead_s`` per engine step (None: the
    profile's 3 ms), ``scale`` of every ``ppd_grid`` length, ``nic_gbps`` (None: 400)."""

    handoff: PDHandoff = PDHandoff()
    overhead_s: float = 0.0
    step_overhead_s: float | None = None
    scale: float = 1.0
    nic_gbps: float | None = None


VLLM = PDHandoff.named("vllm")      # the paper's baseline (vLLM P2P NCCL)
SETS = {
    "base": Assume(),                                                   # warmpath's own handoff
    "ttft-at-D": Assume(PDHandoff(first_token="decode")),
    "recompute": Assume(PDHandoff(recompute=True)),
    "vllm": Assume(VLLM),                                               # both
    "vllm-oh35": Assume(VLLM, overhead_s=0.035),
    "vllm-oh35-h50": Assume(replace(VLLM, extra_s=0.05), overhead_s=0.035),
    "vllm-oh35-x2": Assume(VLLM, overhead_s=0.035, scale=2.0),
    "vllm-oh35-step8": Assume(VLLM, overhead_s=0.035, step_overhead_s=0.008),
    "base-oh35-h90": Assume(PDHandoff(extra_s=0.09), overhead_s=0.035),   # fixed costs alone
    "base-oh35-x2-nic25": Assume(overhead_s=0.035, scale=2.0, nic_gbps=25),
    # the best fits with a slower NIC (figure 5's bandwidth axis)
    "vllm-oh35-h50-nic100": Assume(replace(VLLM, extra_s=0.05), overhead_s=0.035, nic_gbps=100),
    "vllm-oh35-h50-nic25": Assume(replace(VLLM, extra_s=0.05), overhead_s=0.035, nic_gbps=25),
    "base-oh35-h90-nic25": Assume(PDHandoff(extra_s=0.09), overhead_s=0.035, nic_gbps=25),
}
MODES = ("x0", "x1", "dynamic")


def point(name: str, a: Assume, mode: str, rate: float, duration: float, seed: int, split: str = "1P3D") -> dict:
    """One run: turn-2+ TTFT p50 / mean / p90 and TPOT (seconds), local/remote counts."""
    s = ppd_setup(*PPD_SPLITS[split], mode, a.nic_gbps, a.handoff, a.overhead_s)
    if a.step_overhead_s is not None:
        s = replace(s, hardware=replace(s.hardware, step_overhead_s=a.step_overhead_s))
    t = time.time()
    run = simulate_rate(s, partial(ppd_grid, scale=a.scale), rate, duration, {}, seed=seed)
    c = run["classes"]
    return {"set": name, "mode": mode, "rate": rate, "split": split, "duration_s": duration,
            "turn2_ttft_p50_s": c["turn2+"]["ttft_p50_s"], "turn2_ttft_mean_s": c["turn2+"]["ttft_mean_s"],
            "turn2_ttft_p90_s": c["turn2+"]["ttft_p90_s"], "tpot_s": c["all"]["tpot_s"],
            "success": c["all"]["success_rate"], "ppd_local": run["sim"]["ppd_local"],
            "ppd_remote": run["sim"]["ppd_remote"], "wall_s": round(time.time() - t, 1)}


def gains(rows: list[dict]) -> list[dict]:
    """One row per (set, split, rate): turn-2 TTFT p50 and mean per mode (ms) and the change of
    x=1 and dynamic against x=0 (p50 and mean); modes not run yet are None."""
    out = []
    keys = {(r["set"], r["split"], r["rate"]) for r in rows}
    for key in sorted(keys, key=lambda k: (list(SETS).index(k[0]) if k[0] in SETS else len(SETS), k[0], k[1], k[2])):
        by = {r["mode"]: r for r in rows if (r["set"], r["split"], r["rate"]) == key}
        g = {"set": key[0], "split": key[1], "rate": key[2]}
        for m in MODES:
            for stat in ("p50", "mean"):
                v = by[m][f"turn2_ttft_{stat}_s"] if m in by else None
                g[f"{m}_{stat}_ms"] = None if v is None else round(v * 1e3, 1)
        for m in ("x1", "dynamic"):
            for stat in ("p50", "mean"):
                a, b = g[f"x0_{stat}_ms"], g[f"{m}_{stat}_ms"]
                g[f"{m}_{stat}_change"] = None if a is None or b is None else round(b / a - 1, 3)
        out.append(g)
    return out


def table(rows: list[dict]) -> str:
    """Markdown: per set × rate, turn-2 TTFT p50 (mean) in ms for x=0 / x=1 / dynamic and the
    change of x=1 and dynamic vs x=0 on the mean."""
    def f(x, pct=False):
        return "-" if x is None else (f"{x * 100:+.0f}%" if pct else f"{x:g}")
    out = ["| set | split | sessions/s | x=0 p50 (mean) ms | x=1 p50 (mean) ms | dynamic p50 (mean) ms "
           "| x=1 vs x=0 (mean) | dynamic vs x=0 (mean) |", "|" + "---|" * 8]
    for g in gains(rows):
        cells = [f"{f(g[f'{m}_p50_ms'])} ({f(g[f'{m}_mean_ms'])})" for m in MODES]
        out.append(f"| {g['set']} | {g['split']} | {g['rate']:g} | " + " | ".join(cells) + f" | {f(g['x1_mean_change'], True)} "
                   f"| {f(g['dynamic_mean_change'], True)} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--rates", default="0.5,12", help="sessions/s (2 requests each); 0.5 = the paper's 1 QPS")
    p.add_argument("--splits", default="1P3D", help="P/D splits, e.g. 1P3D,2P2D")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/ppd_search.json"))
    a = p.parse_args(argv)
    bad = set(a.sets.split(",")) - set(SETS)
    if bad:
        raise SystemExit(f"--sets: unknown {sorted(bad)}; choose from {list(SETS)}")
    done = read_json(a.out)["rows"] if stored(a.out) else []   # resumed from a kept (maybe gzipped) run
    have = {(r["set"], r["split"], r["mode"], r["rate"]) for r in done}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    todo = [(n, sp, float(r), m) for n in a.sets.split(",") for sp in a.splits.split(",")
            for r in a.rates.split(",") for m in a.modes.split(",") if (n, sp, m, float(r)) not in have]
    for name, split, rate, mode in todo:
        row = point(name, SETS[name], mode, rate, a.duration, a.seed, split)
        done.append(row)
        print(json.dumps(row), flush=True)
        a.out.write_text(json.dumps({"seed": a.seed, "sets": {n: asdict(s) for n, s in SETS.items()},
                                     "rows": done, "gains": gains(done)}, indent=1))
        a.out.with_suffix(".md").write_text(table(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 15: which assumptions reproduce the CPD blog's figure 4 (``warmpath repro cpd``'s
cluster, run point by point): 2P1D's plateau and TTFT p50 near saturation, then CPD-1D's
plateau under the same assumptions, and which workers are busy (the binding queue).

    python -m benchmarks.repro.fig4_search --sets base8b,8b-cold40-a32 --rates 0.6,1.0 \\
        --duration 20 --ramp 10 --jobs 2 --out benchmarks/results/fig4_search.json

Writes the JSON (one row per set × config × rate, appended as points finish, so a partial
search is kept) and a markdown table next to it (``.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

from benchmarks.common.results import read_json, stored
from warmpath.slo import CPD_TARGET
from warmpath.bench.workload import coding_agent, fast_tokens
from warmpath.sim.repro import CPDAssumptions
from warmpath.sim.run import simulate_rate

C = 24                                  # the blog's cap, here on the client (TTFT from the send)
K = dict(max_in_flight=256, max_concurrency=C)
SETS = {
    "base8b": CPDAssumptions(**K),                                          # repro's lengths, client cap
    "8b-a64": CPDAssumptions(answer_tokens=64, **K),
    "8b-cold40": CPDAssumptions(cold_share=0.4, **K),
    "8b-doc128k-cold40-a64": CPDAssumptions(doc_tokens=131072, cold_share=0.4, answer_tokens=64, **K),
    "8b-doc128k-cold25-a64": CPDAssumptions(doc_tokens=131072, cold_share=0.25, answer_tokens=64, **K),
    "8b-cold55-a64": CPDAssumptions(cold_share=0.55, answer_tokens=64, **K),
    "8b-cold30-a64": CPDAssumptions(cold_share=0.3, answer_tokens=64, **K),
    "8b-cold40-a32": CPDAssumptions(cold_share=0.4, answer_tokens=32, **K),
    "8b-doc128k-cold15-a32": CPDAssumptions(doc_tokens=131072, cold_share=0.15, answer_tokens=32, **K),
    "70b-tp4-32k-a32": CPDAssumptions(model="llama-3.1-70b", decode_tp=4, context_tokens=32768, doc_tokens=32768,
                                      answer_tokens=32, **K),
    "70b-tp4-a64": CPDAssumptions(model="llama-3.1-70b", decode_tp=4, answer_tokens=64, **K),
}


def point(name: str, asm: CPDAssumptions, config: str, rate: float, duration: float, seed: int) -> dict:
    """One rate (target QPS/GPU): achieved QPS/GPU, TTFT p50/p90 (all, warm, cold), busy
    fraction per role (mean over its workers), client wait p90."""
    s = asm.setup(config)
    make = partial(coding_agent, gen=fast_tokens, **asm.workload())
    run = simulate_rate(s, make, rate * s.gpus, duration, CPD_TARGET, asm.ramp_s, seed=seed)
    c, busy = run["classes"], {}
    for wid, b in run["sim"]["worker_busy"].items():
        busy.setdefault(wid.rsplit("-", 1)[0], []).append(b)
    return {"set": name, "config": config, "rate": rate, "gpus": s.gpus,
            "achieved_qps_per_gpu": run["achieved_rps"] / s.gpus, "duration_s": run["duration_s"],
            "ttft_p50_s": c["all"]["ttft_p50_s"], "ttft_p90_s": c["all"]["ttft_p90_s"],
            "warm_ttft_p50_s": c.get("warm", {}).get("ttft_p50_s"), "cold_ttft_p50_s": c.get("cold", {}).get("ttft_p50_s"),
            "tpot_s": c["all"]["tpot_s"], "client_wait_p90_s": c["all"].get("client_wait_p90_s"),
            "success": c["all"]["success_rate"], "slo_met": run["slo_met"],
            "busy": {r: sum(v) / len(v) for r, v in busy.items()}, "wall_s": run["sim"]["wall_s"]}


def table(rows: list[dict]) -> str:
    """Markdown: one line per set × rate, 2P1D and CPD-1D side by side."""
    head = ("| set | target | 2P1D QPS/GPU | 2P1D TTFT p50 / p90 (s) | CPD-1D QPS/GPU | CPD-1D TTFT p50 / p90 (s) "
            "| busy 2P1D (prefill / decode) | busy CPD-1D (pre-prefill / prefill / decode) |")
    out = [head, "|" + "---|" * 8]

    def f(x):
        return "-" if x is None else f"{x:.2f}"
    keys = sorted({(r["set"], r["rate"]) for r in rows}, key=lambda k: (list(SETS).index(k[0]), k[1]))
    for k in keys:
        by = {r["config"]: r for r in rows if (r["set"], r["rate"]) == k}
        cells = []
        for cfg in ("2P1D", "CPD-1D"):
            r = by.get(cfg)
            cells += ["-", "-"] if r is None else [f(r["achieved_qps_per_gpu"]), f"{f(r['ttft_p50_s'])} / {f(r['ttft_p90_s'])}"]
        busy = [" / ".join(f(by[cfg]["busy"].get(role)) for role in roles) if cfg in by else "-"
                for cfg, roles in (("2P1D", ("prefill", "decode")), ("CPD-1D", ("pre-prefill", "prefill", "decode")))]
        out.append(f"| {k[0]} | {k[1]} | " + " | ".join(cells + busy) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--configs", default="2P1D,CPD-1D")
    p.add_argument("--rates", default="0.8,1.2")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--ramp", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/fig4_search.json"))
    a = p.parse_args(argv)
    bad = set(a.sets.split(",")) - set(SETS)
    if bad:
        raise SystemExit(f"--sets: unknown {sorted(bad)}; choose from {list(SETS)}")
    done = read_json(a.out)["rows"] if stored(a.out) else []   # resumed from a kept (maybe gzipped) run
    have = {(r["set"], r["config"], r["rate"]) for r in done}
    todo = [(n, c, float(r)) for n in a.sets.split(",") for r in a.rates.split(",") for c in a.configs.split(",")
            if (n, c, float(r)) not in have]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(a.jobs) as pool:
        futs = [pool.submit(point, n, replace(SETS[n], ramp_s=a.ramp), c, r, a.duration, a.seed) for n, c, r in todo]
        for fut in as_completed(futs):
            row = fut.result()
            done.append(row)
            print(json.dumps({k: row[k] for k in ("set", "config", "rate", "achieved_qps_per_gpu", "ttft_p50_s",
                                                  "ttft_p90_s", "busy", "wall_s")}), flush=True)
            a.out.write_text(json.dumps({"duration_s": a.duration, "ramp_s": a.ramp, "seed": a.seed,
                                         "sets": {n: asdict(s) for n, s in SETS.items()}, "rows": done}, indent=1))
            a.out.with_suffix(".md").write_text(table(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())

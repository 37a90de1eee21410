"""Near saturation, request by request (issue 28): a real ``warmpath bench`` run of ``cpd-1d``
beside the simulation a user gets of it (``bench --sim`` with the calibration), and where
the time goes on each side.

Per class and side: TTFT split into the router's admission wait (``Server-Timing`` ``route``;
the simulator reports it too) and the rest, TPOT, E2E, failures; per request (``--requests``)
both sides by session and turn. The simulated workers keep step traces (``SimWorker.trace``)
and so may the real ones (``--real-trace``, a ``warmpath serve --step-trace`` folder or file):
per worker, the seconds of pure decode, mixed and prefill steps, the prompt tokens a decode
worker computed (KV it did not find), and a pure decode step's time over the step model's
(median by batch: what sharing the cores and the machine's state add to the calibrated step),
and the same by how many other workers stepped beside it (0 / 1 / 2+: the model's own error
apart from processor sharing).

    python -m benchmarks.sim_accuracy.saturation_diag --real benchmarks/results/sim_accuracy/real_0.2_s302 \\
        --rate 0.2 --seed 302 [--scatter 0] [--requests] [--real-trace DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

from benchmarks.common.results import read_jsonl, stored
from warmpath.bench.arrivals import ArrivalConfig, arrival_times, session_seed
from warmpath.bench.requests_log import request_row
from warmpath.bench.workload import coding_agent
from warmpath.engine.step_model import StepModel
from warmpath.engine.step_trace import overlaps

CAL = Path("benchmarks/results/sim_accuracy/calibration_refit.json")


def sim_setup(calibration: Path, timeout: float, scatter: int, flags: dict | None = None):
    """The :class:`~warmpath.sim.run.SimSetup` ``bench --sim`` builds from the documented
    config (``sim_accuracy.simulate``'s) with scatter seed ``scatter``."""
    from warmpath.sim.cli import add_parser, setup_from_args

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    conf = {"topology": "cpd-1d", "hardware": "cpu", "model": "smollm2-135m", "calibration": str(calibration),
            "seed": scatter, **(flags or {})}
    a = p.parse_args(["sim", "--workload", "coding-agent",
                      *[x for k, v in conf.items() for x in (f"--{k.replace('_', '-')}", str(v))]])
    a.calibration, a.timeout, a.max_concurrency = Path(a.calibration), timeout, None
    return setup_from_args(a)


def simulate(setup, rate: float, seed: int, duration: float) -> tuple[list[dict], dict[str, list[dict]], object]:
    """One simulated run as ``bench --sim`` makes it, every worker tracing its steps: the
    ``requests.jsonl`` rows, the traces by worker, the simulation."""
    from warmpath.sim.run import build

    times = arrival_times(ArrivalConfig(rate, duration, seed=seed))
    sessions = coding_agent(len(times), session_seed(seed, rate))
    for s, t in zip(sessions, times):
        s.start = t
    sim = build(setup)
    for w in sim.workers.values():
        w.trace = []
    records = sim.run(sessions)
    return [request_row(r, rate, None) for r in records], {k: w.trace for k, w in sim.workers.items()}, sim


def read_trace(path: Path) -> dict[str, list[dict]]:
    """A ``--step-trace`` folder (``*.jsonl`` or ``*.jsonl.gz``) or file → steps by worker."""
    files = sorted([*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")]) if path.is_dir() else [path]
    opener = lambda f: gzip.open(f, "rt") if f.suffix == ".gz" else f.open()   # noqa: E731
    return {f.name.split(".")[0]: [json.loads(x) for x in opener(f) if x.strip()] for f in files}


def step_summary(steps: list[dict], model: StepModel) -> dict:
    """Seconds of decode / mixed / prefill steps, prompt tokens computed, and a pure decode
    step's wall time (less its KV loads) over the model's, median by batch (1..8+)."""
    out = {"decode_s": 0.0, "mixed_s": 0.0, "prefill_s": 0.0, "steps": len(steps), "prompt_tokens": 0}
    ratio: dict[int, list[float]] = {}
    for s in steps:
        items = [tuple(x) for x in s["items"]]
        if not items:
            continue
        wall = s["t1"] - s["t0"] - s.get("tiers_s", 0.0)
        pre = sum(n for n, _ in items if n > 1)
        kind = "prefill_s" if all(n > 1 for n, _ in items) else ("mixed_s" if pre else "decode_s")
        out[kind] += wall
        out["prompt_tokens"] += pre
        if kind == "decode_s":
            ratio.setdefault(min(len(items), 8), []).append(wall / model.step_s(items))
    out["decode_over_model"] = {b: round(statistics.median(v), 3) for b, v in sorted(ratio.items())}
    every = [x for v in ratio.values() for x in v]
    out["decode_over_model_all"] = round(statistics.median(every), 3) if every else None
    return out


def decode_by_company(traces: dict[str, list[dict]], model: StepModel) -> dict:
    """Per worker: a pure decode step's wall time (less its KV loads) over the model's, median
    by how many other workers stepped beside it (0, 1, 2+; processor sharing on 2 cores makes
    2+ cost ~1.5x): the model's own error (0) apart from what sharing adds."""
    out = {}
    for w, ks in overlaps(traces).items():
        by: dict[int, list[float]] = {}
        for s, k in zip(traces[w], ks):
            items = [tuple(x) for x in s["items"]]
            wall = s["t1"] - s["t0"] - s.get("tiers_s", 0.0)
            if items and all(n == 1 for n, _ in items) and wall > 0:
                by.setdefault(min(2, round(k)), []).append(wall / model.step_s(items))
        if by:
            out[w] = {k: {"steps": len(v), "median": round(statistics.median(v), 3)} for k, v in sorted(by.items())}
    return out


def class_summary(rows: list[dict]) -> dict:
    """Per class: completed, failed, median TTFT, median admission wait, median TPOT and E2E."""
    out = {}
    for cls in ("warm", "cold"):
        rs = [r for r in rows if r["class"] == cls]
        ok = [r for r in rs if r["ok"]]
        med = lambda f: round(statistics.median(f(r) for r in ok), 3) if ok else None   # noqa: E731
        out[cls] = {"completed": len(ok), "failed": len(rs) - len(ok), "ttft_p50": med(lambda r: r["ttft_s"]),
                    "route_p50": med(lambda r: (r.get("server_timing") or {}).get("route", 0.0)),
                    "tpot_p50": med(lambda r: r["tpot_s"]), "e2e_p50": med(lambda r: r["e2e_s"])}
    return out


def paired(real: list[dict], sim: list[dict]) -> dict:
    """Requests answered on both sides (by session and turn): median sim / real TPOT and E2E."""
    got = {(r["sid"], r["turn"]): r for r in sim if r["ok"]}
    pairs = [(r, got[(r["sid"], r["turn"])]) for r in real if r["ok"] and (r["sid"], r["turn"]) in got]
    ratio = lambda k: round(statistics.median(s[k] / r[k] for r, s in pairs if r[k]), 3) if pairs else None  # noqa
    return {"pairs": len(pairs), "tpot_sim_over_real": ratio("tpot_s"), "e2e_sim_over_real": ratio("e2e_s")}


def side(r: dict | None) -> str:
    """One side of a request's line: prefill worker, admission wait, TTFT, TPOT."""
    if r is None:
        return "(not there)"
    f = lambda k: "-" if r.get(k) is None else f"{r[k]:6.2f}"   # noqa: E731
    route = (r.get("server_timing") or {}).get("route", 0.0)
    return f"{r.get('prefill') or '-':13s} route {route:6.2f} ttft {f('ttft_s')} tpot {f('tpot_s')}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", type=Path, required=True, help="the real run's bench --out folder")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--scatter", type=int, default=0)
    p.add_argument("--calibration", type=Path, default=CAL)
    p.add_argument("--sim-flags", default="{}", help="extra `warmpath sim` flags as JSON")
    p.add_argument("--real-trace", type=Path, help="the real run's --step-trace folder or file")
    p.add_argument("--requests", action="store_true", help="print every request on both sides")
    p.add_argument("--out", type=Path, help="also write the summary (JSON) here")
    a = p.parse_args()
    log = a.real / "requests.jsonl"   # runs before issue 28 kept none
    real = read_jsonl(log) if stored(log) else []   # plain or gzipped
    setup = sim_setup(a.calibration, a.timeout, a.scatter, json.loads(a.sim_flags))
    sim, traces, s = simulate(setup, a.rate, a.seed, a.duration)
    model = setup.fitted
    out = {"real": class_summary(real) if real else None, "sim": class_summary(sim), "paired": paired(real, sim),
           "sim_steps": {w: step_summary(t, model) for w, t in traces.items()},
           "sim_store_refused_blocks": s.store.refused if s.store else 0}
    out["sim_decode_by_company"] = decode_by_company(traces, model)
    if a.real_trace:
        real_traces = read_trace(a.real_trace)
        out["real_steps"] = {w: step_summary(t, model) for w, t in real_traces.items()}
        out["real_decode_by_company"] = decode_by_company(real_traces, model)
    if a.requests:
        got = {(r["sid"], r["turn"]): r for r in sim}
        for r in real:
            print(f"{r['sid']:8s} t{r['turn']} {r['class']:4s} | {side(r)} | {side(got.get((r['sid'], r['turn'])))}")
    out["command"] = " ".join(["python -m benchmarks.sim_accuracy.saturation_diag", *sys.argv[1:]])
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

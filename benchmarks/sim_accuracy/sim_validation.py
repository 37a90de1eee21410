"""Simulator vs the real cluster on this machine: same workload, topology, rates and seeds.

Reads the real runs of ``benchmarks/policies/real_policies.py`` (``benchmarks/results/cluster``, plus its
repeats, ``--repeats``: by default ``cluster_repeats/run1..6``) and replays each on a simulated
cluster the way it ran (primed, its rates in order), ``--replicas`` times with other seeds of
the steps' scatter. CPU profile: a ``warmpath calibrate --threads 1`` step model, the scatter
and contention ``calibrate --from-trace`` measured on served runs (``--variation``), 2 cores
shared by processor sharing, 0.5 GiB L1 + 0.5 GiB L2 per worker, a 2 GiB store behind one L3
link (one segment holder), and what
``benchmarks/sim_accuracy/request_overhead.py`` (router/HTTP time, L3 write speed, the holder's CPU) and
``benchmarks/sim_accuracy/answer_retokenize.py`` (answers whose KV the client's re-tokenization loses)
measured on other runs. For every rate point the first real run served within its SLO (below
saturation) it reports the absolute error of TTFT p50 and TPOT against the mean of the real
runs, their medians, the real runs' own spread, and a one-request-at-a-time check.

    python -m benchmarks.sim_accuracy.sim_validation [--results benchmarks/results/cluster]
        [--repeats DIR,DIR] [--overhead benchmarks/results/request_overhead.json]
        [--answers benchmarks/results/answer_retokenize.json] [--calibration FILE]
        [--variation FILE] [--replicas 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.common import (
    workload as real,  # benchmarks/policies/real_policies.py: the same workload definitions
)
from benchmarks.common.results import read_json
from warmpath.bench.arrivals import ArrivalConfig, arrival_times, session_seed
from warmpath.bench.metrics import summarize
from warmpath.bench.workload import Session, Turn, repo_contexts
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.step_model import StepModel
from warmpath.launch.topology import resolve
from warmpath.sim.cli import CPU
from warmpath.sim.hardware import MODELS
from warmpath.sim.run import SimSetup, build

GIB = 1 << 30


def primes() -> list[Session]:
    """``benchmarks/policies/real_policies.py``'s priming: each repository context sent once, one after another."""
    return [Session(f"prime-{i}", [Turn(ctx[-1:] + [1000, 1001], 1)], prefix=ctx[:-1], start=20.0 * i)
            for i, ctx in enumerate(repo_contexts(real.SEED, real.AGENT["repos"], real.AGENT["context"]))]


def cluster_setup(topology: str, fitted: StepModel, hw, measured: dict) -> SimSetup:
    """The real cluster's shape on the CPU profile: 2 shared cores, 0.5 GiB L1 + 0.5 GiB L2 per
    worker, the workers' batching flags, one L3 link (one Mooncake segment holder serves every
    transfer), plus ``measured`` (``request_overhead_s``, ``retokenize_miss``, ``transfer_cpu``)."""
    m = MODELS["smollm2-135m"]
    return SimSetup(resolve(topology), m, hw, fitted=fitted, kv_blocks=int(0.5 * GIB // (16 * m.kv_bytes_per_token)),
                    l2_gib=0.5, scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512,
                                                          max_model_len=8192),
                    cpu_cores=2, store_bytes_s=hw.nic_bytes_s, l3_gib=2.0, **measured)


def simulate_sweep(setup: SimSetup, rates: list[float], duration: float, seed: int = real.SEED,
                   judge=None) -> dict[float, dict]:
    """The real benchmark's procedure on one simulated cluster: prime the repository contexts,
    then each rate in the run's order, each after the previous one drained (the caches carry
    over, as they did on the real cluster). ``seed``: the run's ``--seed`` (arrivals; sessions
    ``bench/arrivals.session_seed``). Per rate ``judge(records, duration_s, rate)``; by default
    the bench summary's classes under ``real.TARGET``."""
    judge = judge or (lambda recs, dur, rate: summarize(recs, dur, real.TARGET))
    sim = build(setup)
    sim.run(primes())
    out = {}
    for rate in rates:
        start, seen = sim.now + 1.0, len(sim.records)
        times = arrival_times(ArrivalConfig(rate, duration, seed=seed))
        sessions = real.agent(len(times), session_seed(seed, rate))
        for s, t in zip(sessions, times):
            s.start = start + t
        recs = sim.run(sessions)[seen:]
        out[rate] = judge(recs, max(sim.now - start, duration), rate)
    return out


def zero_load(setup: SimSetup, measured: dict, replicas: int = 1) -> dict:
    """Per-request TTFT with nothing else running: ``request_overhead.py``'s one-at-a-time run
    (its sessions, seed and order) against the simulator given the sessions far apart (the
    mean over ``replicas`` seeds of the step scatter)."""
    w = measured["workload"]
    got: dict[tuple, list] = {}
    for k in range(replicas):
        sessions = real.agent(w["sessions"], w["seed"])
        for i, s in enumerate(sessions):
            s.start = 100.0 + 120.0 * i
        for r in build(replace(setup, seed=k)).run(primes() + sessions):
            got.setdefault((r.sid, r.turn), []).append(r)
    rows = []
    for m in measured["rows"]:
        ps = got[(m["sid"], m["turn"])]
        p, ttft = ps[0], statistics.fmean(x.ttft for x in ps)
        rows.append({"sid": m["sid"], "turn": m["turn"], "cls": m["cls"], "prompt_tokens": [m["prompt_tokens"],
                     p.prompt_tokens], "cached_tokens": [m["cached_tokens"], p.cached_tokens],
                     "ttft_s": [m["client_ttft_s"], ttft], "abs_err": rel(ttft, m["client_ttft_s"])})
    errs = {c: statistics.median(r["abs_err"] for r in rows if r["cls"] == c) for c in ("warm", "cold")}
    return {"requests": rows, "median_abs_err": errs}


def mean_or_none(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def rel(a: float, b: float) -> float:
    return abs(a - b) / b


def cpu_profile(calibration: Path, variation: Path | None, overhead: Path, answers: Path | None,
                l3_gbps: float | None = None):
    """This machine as the simulator's CPU profile, from measurements taken on other runs:
    (step model, hardware, SimSetup extras, request_overhead.py's output)."""
    cal = json.loads(calibration.read_text())
    fitted = StepModel.from_json(cal["step_model"])
    # measured by `calibrate --from-trace` on served runs: steps' scatter and their contention
    var_src = json.loads(variation.read_text()) if variation and variation.exists() else cal
    variation = {k: max(0.0, var_src[k]) for k in ("step_cv", "contention") if var_src.get(k) is not None}
    hw = replace(CPU, nic_bytes_s=l3_gbps * 1e9) if l3_gbps else CPU
    measured = json.loads(overhead.read_text()) if overhead.exists() else {}
    overhead = measured["overhead_s"]["median"] if measured else 0.0
    # the segment holder's CPU while KV moves (it shares the machine's cores with the workers)
    holder = measured.get("cpu_s", {}).get("holder_cores_per_transfer", 0.0) if measured else 0.0
    put = measured.get("l3_put") if measured else None
    if put:   # L3 writes as measured per request: fixed cost + bandwidth (the link adds its latency)
        hw = replace(hw, l3_write_bytes_s=put["write_bytes_s"],
                     l3_write_latency_s=max(0.0, put["fixed_s"] - hw.net_latency_s))
    # the client re-tokenizes answers (as the real run's did): the share whose KV it loses
    miss = json.loads(answers.read_text())["miss_share"] if answers and answers.exists() else 0.0
    extra = {"request_overhead_s": overhead, "retokenize_miss": miss, "transfer_cpu": holder, **variation}
    return fitted, hw, extra, measured


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=Path("benchmarks/results/cluster"))
    p.add_argument("--calibration", type=Path, default=Path("benchmarks/results/cluster/calibration_insitu.json"),
                   help="`warmpath calibrate` output (default: isolated steps + the one-at-a-time run's step "
                        "trace, see docs/benchmarks/sim_accuracy.md; the cluster run's own: .../cluster/calibration.json)")
    p.add_argument("--repeats", default=",".join(f"benchmarks/results/cluster_repeats/run{i}" for i in range(1, 7)),
                   help="more result folders of the same benchmark, comma-separated")
    p.add_argument("--overhead", type=Path, default=Path("benchmarks/results/request_overhead.json"),
                   help="benchmarks/sim_accuracy/request_overhead.py output (its median per-request overhead)")
    p.add_argument("--answers", type=Path, default=Path("benchmarks/results/answer_retokenize.json"),
                   help="benchmarks/sim_accuracy/answer_retokenize.py output: the share of answers the client's "
                        "re-tokenization changes (give a missing file for a client that sends ids back)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sim_validation.json"))
    p.add_argument("--duration", type=float, default=90.0, help="the real run's --duration")
    p.add_argument("--variation", type=Path, default=Path("benchmarks/results/cluster/calibration_traced.json"),
                   help="`warmpath calibrate --from-trace` output whose step_cv and contention to use (measured "
                        "on four traced runs; give a missing file to take them from --calibration)")
    p.add_argument("--replicas", type=int, default=5,
                   help="simulations per real run, with other seeds of the step scatter (step_cv); averaged")
    p.add_argument("--l3-gbps", type=float, default=None,
                   help="L3 bandwidth of the CPU profile in GB/s (default: its 1.0, measured alone)")
    return p.parse_args()


def validate(topo: str, dirs: list[Path], setup, a: argparse.Namespace, err: dict) -> list[dict]:
    """Every point of ``topo`` the first real run met its SLO at: the real runs against
    their simulation (errors appended to ``err``)."""
    rows = []
    runs = [read_json(d / topo / "summary.json") for d in dirs]   # plain or gzipped
    # each real run in its own order of rates, on one cluster: simulate each the same way,
    # as many times as --replicas with other draws of the steps' scatter
    reps = a.replicas if setup.step_cv else 1
    by_order: dict[tuple, list] = {}   # runs with the same rates in the same order simulate alike
    for run in runs:
        order = tuple(float(r) for r in run["runs"])
        if order not in by_order:
            by_order[order] = [simulate_sweep(replace(setup, seed=k), list(order), a.duration)
                               for k in range(reps)]
    sims = [by_order[tuple(float(r) for r in run["runs"])] for run in runs]
    for r, run in runs[0]["runs"].items():
        if not run["meets_slo"]:
            continue   # saturated: queueing dominates and small errors explode
        meas = [s["rates"][r]["all"] for s in runs if r in s["rates"]]
        got = [rep[float(r)] for sm, s in zip(sims, runs) if r in s["rates"] for rep in sm]
        classes = {c: {k: mean_or_none([g[c][k] for g in got]) for k in ("ttft_p50_s", "ttft_p90_s", "tpot_s")}
                   for c in ("all", "turn1", "turn2+")}
        pred = classes["all"]
        row = {"topology": topo, "rate": float(r), "real_runs": len(meas)}
        for k in ("ttft_p50", "tpot"):
            vals = [m[f"{k}_s"] for m in meas]
            mean = statistics.fmean(vals)
            row[f"{k}_s"] = {"measured_runs": vals, "measured_mean": mean, "simulated": pred[f"{k}_s"],
                             "abs_err": rel(pred[f"{k}_s"], mean)}
            err[k].append(row[f"{k}_s"]["abs_err"])
            if len(vals) > 1:   # how far one real run is from the mean of the runs
                err[f"{k}_run_to_run"].append(statistics.median(rel(v, mean) for v in vals))
        # beside the goal: per class, the p50 is not torn between first turns and follow-ups
        for c in ("turn1", "turn2+"):
            vals = [s["rates"][r][c]["ttft_p50_s"] for s in runs if r in s["rates"]]
            if vals and classes[c]["ttft_p50_s"] is not None:
                e = rel(classes[c]["ttft_p50_s"], statistics.fmean(vals))
                row[f"ttft_p50_{c}_s"] = {"measured_mean": statistics.fmean(vals),
                                          "simulated": classes[c]["ttft_p50_s"], "abs_err": e}
                err.setdefault(f"ttft_p50_{c}", []).append(e)
        row["ttft_p90_s"] = {"measured_runs": [m["ttft_p90_s"] for m in meas], "simulated": pred["ttft_p90_s"]}
        rows.append(row)
        t, o = row["ttft_p50_s"], row["tpot_s"]
        print(f"{topo} rate {r}: TTFT p50 measured {' '.join(f'{v:.3f}' for v in t['measured_runs'])} "
              f"(mean {t['measured_mean']:.3f}) simulated {t['simulated']:.3f} ({t['abs_err']:.0%}) | TPOT "
              f"measured mean {o['measured_mean']:.3f} simulated {o['simulated']:.3f} ({o['abs_err']:.0%})")
    return rows


def main() -> int:
    a = parse_args()
    fitted, hw, extra, measured = cpu_profile(a.calibration, a.variation, a.overhead, a.answers, a.l3_gbps)
    dirs = [a.results] + [Path(x) for x in a.repeats.split(",") if x]
    err = {"ttft_p50": [], "tpot": [], "ttft_p50_run_to_run": [], "tpot_run_to_run": []}
    rows = [row for topo in ("cpd-1d", "pd-2p1d")
            for row in validate(topo, dirs, cluster_setup(topo, fitted, hw, extra), a, err)]
    out0 = None
    if a.overhead.exists():
        zsetup = cluster_setup("cpd-1d", fitted, hw, extra)
        out0 = zero_load(zsetup, measured, a.replicas if zsetup.step_cv else 1)
        print("one request at a time, median TTFT error:", json.dumps(out0["median_abs_err"]))
    out = {"command": " ".join(["python", *sys.argv]), "calibration": str(a.calibration), "l3_bytes_s": hw.nic_bytes_s,
           **{k: extra.get(k) for k in ("request_overhead_s", "retokenize_miss", "transfer_cpu", "step_cv",
                                        "contention")},
           "l3_write_bytes_s": hw.l3_write_bytes_s, "l3_write_latency_s": hw.l3_write_latency_s,
           "variation": str(a.variation) if a.variation and a.variation.exists() else str(a.calibration),
           "replicas": a.replicas, "zero_load": out0, "real_runs": [str(d) for d in dirs], "points": rows,
           "median_abs_err": {k: statistics.median(v) if v else None for k, v in err.items()}}
    a.out.write_text(json.dumps(out, indent=1))
    print("median absolute error:", json.dumps(out["median_abs_err"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Routing policies against each other in the simulator, on this machine's validated CPU
profile (``benchmarks/sim_accuracy/sim_validation.py``: TTFT p50 within ~7% of the real cluster).

Part A, cold share: the coding-agent workload of ``benchmarks/policies/real_policies.py`` (3 primed
repository contexts of 1,536 tokens, multi-turn sessions, new 2,048-token documents) with
0/10/25/50/75% of the sessions new documents; the same 3 workers as ``cpd-1d`` (warmpath's
CPD: cost-based tiers), ``pd-2p1d`` (cache-blind PD), ``pd-2p1d`` under ``pd-kv`` (one pool,
KV-aware cost: the Dynamo / llm-d style) and three prefix-aware replicas. For each: the
highest session rate sustained (that rate and every lower one met the SLO), per seed.
With ``--profile b200`` the same sweep runs on ``warmpath repro cpd``'s simulated cluster:
B200, Llama-3.1-8B, 12 GPUs as CPD-1D (pre-prefill + prefill nodes of TP4, 4 TP1 decode
instances), 2P1D (pd and pd-kv) or 3 TP4 replicas; its coding-agent workload (16 primed
repositories of 64K tokens, 2K-token questions, 1-4 turns, new 64K-token documents,
128-token answers); at most 64 in flight (the rest wait at the router, in TTFT); rates on a
10% grid searched from a first guess (``sustained_from``).
Part B, drift: 10% → 60% → 10% cold (a third of the run each) on 2 pre-prefill + 2 prefill
+ 2 decode workers on the simulated B200 / Llama-3.1-8B profile, elastic tiers on vs off:
warm TTFT p90 per 20 s window and the role changes.
Part C, decision time (``benchmarks/policies/decide.py``, also runnable alone): the router's plan
(hashing, KV index lookup, model, policy; the tokenizer excluded) at 2K / 32K / 128K-token
prompts, cold and follow-up turns, p50 and p99.

SLO (stated before measuring, as ``benchmarks/policies/real_policies.py``): warm TTFT p90 ≤ 2 s, cold
TTFT p90 ≤ 20 s, ≥ 99% of requests succeed. TTFT is timed from arrival.

    python -m benchmarks.policies.sim_policies [--parts share,drift,decide] [--seeds 3] [--duration 300]
        [--profile cpu|b200] [--shares 0,0.25] [--configs cpd,pd] [--out benchmarks/results/policies.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.common import workload as real  # the workload and SLO of the real benchmark
from benchmarks.policies import decide  # part C
from benchmarks.policies.sim_drift import part_drift, plot_drift  # part B
from benchmarks.sim_accuracy import sim_validation as val  # the validated CPU profile

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.bench.metrics import summarize
from warmpath.bench.workload import coding_agent, fast_tokens
from warmpath.launch.topology import Topology, resolve
from warmpath.sim.repro import CPD_CONFIGS, CPD_WORKLOAD
from warmpath.sim.run import build

SHARES = (0.0, 0.1, 0.25, 0.5, 0.75)
RATES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.2)
CONFIGS = {"cpd": ("cpd-1d", None), "pd": ("pd-2p1d", None), "pd-kv": ("pd-2p1d", "pd-kv"),
           "replica": (Topology("replica-3", "replica", {"replica": 3}), None)}


def workload(cold: float):
    def make(n: int, seed: int):
        return coding_agent(n, seed, primed=True, repo_seed=real.SEED, **{**real.AGENT, "warm_ratio": 1 - cold})
    return make


def point(setup, make, rate: float, duration: float, seed: int, primes=None, log: list | None = None) -> bool:
    """One primed cluster at ``rate`` sessions/s: did it meet the SLO? (``log``: gets the
    point's per-class TTFT p90, success and per-worker busy share, to see what saturates.)"""
    sim = build(replace(setup, seed=seed))
    sim.run(primes() if primes else val.primes())
    start, seen = sim.now + 1.0, len(sim.records)
    busy0 = {w.wid: w.busy_s for w in sim.workers.values()}
    times = arrival_times(ArrivalConfig(rate, duration, seed=seed))
    sessions = make(len(times), seed)
    for s, t in zip(sessions, times):
        s.start = start + t
    recs = sim.run(sessions)[seen:]
    span = max(sim.now - start, duration)
    classes = summarize(recs, span, real.TARGET)
    ok = real.meets(classes)
    if log is not None:
        log.append({"rate": rate, "met": ok, "span_s": span,
                    **{f"{c}_ttft_p90_s": classes[c]["ttft_p90_s"] for c in ("warm", "cold")},
                    **{f"{c}_ttft_p50_s": classes[c]["ttft_p50_s"] for c in ("warm", "cold")},
                    "success": classes["all"]["success_rate"], "tpot_s": classes["all"]["tpot_s"], "requests": classes["all"]["completed"],
                    "busy": {w.wid: round((w.busy_s - busy0[w.wid]) / span, 3) for w in sim.workers.values()},
                    "role_changes": [(round(t - start, 1), w, r) for t, w, r in sim.stats.role_changes
                                     if t >= start]})
    return ok


def sustained(setup, make, duration: float, seed: int, rates=RATES, primes=None, log=None) -> float:
    """The highest rate of ``rates`` met with every lower rate met too."""
    best = 0.0
    for r in rates:
        if not point(setup, make, r, duration, seed, primes, log):
            break
        best = r
    return best


def sustained_from(setup, make, duration: float, seed: int, rates, guess: float, step: int, primes=None,
                   log=None) -> float:
    """The highest rate of ``rates`` met, searched from ``guess``: up (or down) every
    ``step``-th rate to the first change, then the rates between. Rates below the lowest one
    tried are not simulated (assumed met), nor those between two met points."""
    i = min(range(len(rates)), key=lambda k: abs(rates[k] - guess))
    met = {}

    def ok(k: int) -> bool:
        if k not in met:
            met[k] = point(setup, make, rates[k], duration, seed, primes, log)
        return met[k]

    if ok(i):
        while i + step < len(rates) and ok(i + step):
            i += step
        hi = min(i + step, len(rates))
    else:
        hi = i
        while hi - step >= 0 and not ok(hi - step):
            hi -= step
        i = hi - step
        if i < 0:
            return 0.0
    for k in range(i + 1, hi):
        if not ok(k):
            break
        i = k
    return rates[i]


def part_share(profile, seeds: int, duration: float) -> dict:
    fitted, hw, extra, _ = profile
    out = {}
    for cold in SHARES:
        row = {}
        for name, (topo, policy) in CONFIGS.items():
            t = topo if isinstance(topo, Topology) else resolve(topo, None, policy)
            setup = replace(val.cluster_setup("cpd-1d", fitted, hw, extra), topology=t)
            got = [sustained(setup, workload(cold), duration, s) for s in range(seeds)]
            row[name] = {"runs": got, "median": statistics.median(got), "spread": [min(got), max(got)]}
        base = max(v["median"] for k, v in row.items() if k != "cpd")
        row["cpd_vs_best_baseline"] = row["cpd"]["median"] / base if base else None
        out[str(cold)] = row
        print(f"cold {cold:.0%}: " + ", ".join(f"{k} {v['median']} {v['spread']}" for k, v in row.items()
                                              if isinstance(v, dict)) + f" | cpd/best {row['cpd_vs_best_baseline']}",
              flush=True)
    return out


# --profile b200: `warmpath repro cpd`'s 12 GPUs (prefill-type nodes TP4, decode DP4 = 4 TP1
# instances per node) and its coding-agent workload, with the share of new documents varied.
B200_TP = {"pre-prefill": 4, "prefill": 4, "replica": 4}
B200_CONFIGS = {"cpd": CPD_CONFIGS["CPD-1D"], "pd": CPD_CONFIGS["2P1D"],
                "pd-kv": replace(CPD_CONFIGS["2P1D"], name="2P1D+pd-kv", policy="pd-kv"),
                "replica": Topology("3R-TP4", "replica", {"replica": 3})}
B200_AGENT = {k: v for k, v in CPD_WORKLOAD.items() if k != "warm_ratio"}
B200_REPO_SEED = 11
B200_IN_FLIGHT = None    # the router's admission sized to the fleet (before issue 33: a fixed 64)
# sessions/s over the 12 GPUs: 10% steps, searched every second one first (see sustained_from)
B200_RATES = tuple(round(1.0 * 1.1 ** k, 2) for k in range(40))
B200_GUESS = {0.0: 8.14, 0.1: 8.14, 0.25: 8.14, 0.5: 5.05, 0.75: 3.45}   # sessions/s, first tried


def b200_setup(topo: Topology, in_flight: int | None = B200_IN_FLIGHT):
    from warmpath.routing.admission import AdmissionConfig
    from warmpath.sim.hardware import HARDWARE, MODELS
    from warmpath.sim.run import SimSetup

    # admission as the router does it (None: sized to the fleet, router/admission.fleet_limit,
    # queues scaled with it) or a fixed limit with 4096-deep queues (the runs before issue 33:
    # 64, what the 4 decode GPUs' KV holds at 64K-token contexts); L1 as the GPUs' memory holds
    # (the simulator's default cap of 1M tokens per worker lifted); 256-token blocks (the prefix
    # cache's granularity; 16 makes each point ~4x slower to simulate)
    adm = AdmissionConfig() if in_flight is None else AdmissionConfig(in_flight, {"cold": 4096, "warm": 4096})
    return SimSetup(topo, MODELS["llama-3.1-8b"], HARDWARE["b200"], tp=B200_TP, max_kv_blocks=1 << 22,
                    block_size=256, admission=adm)


def b200_primes():
    from warmpath.bench.workload import Session, Turn, repo_contexts

    ctxs = repo_contexts(B200_REPO_SEED, B200_AGENT["repos"], B200_AGENT["context"], fast_tokens)
    return [Session(f"prime-{i}", [Turn(c[-1:] + [1000], 1)], prefix=c[:-1], start=0.5 * i)
            for i, c in enumerate(ctxs)]


def b200_workload(cold: float):
    def make(n: int, seed: int):
        return coding_agent(n, seed, primed=True, repo_seed=B200_REPO_SEED, gen=fast_tokens,
                            **{**B200_AGENT, "warm_ratio": 1 - cold})
    return make


def part_share_b200(seeds: int, duration: float, shares=SHARES, configs=None, guess: dict | None = None,
                    out_path: Path | None = None, in_flight: int | None = B200_IN_FLIGHT) -> dict:
    """The cold-share sweep on the B200 profile; ``guess``: the first rate tried per share
    (sessions/s, :func:`sustained_from`); ``out_path``: written after each share."""
    out = {}
    for cold in shares:
        row = {}
        for name in configs or B200_CONFIGS:
            setup = b200_setup(B200_CONFIGS[name], in_flight)
            got, logs = [], []
            for s in range(seeds):
                log = []
                got.append(sustained_from(setup, b200_workload(cold), duration, s, B200_RATES,
                                          (guess or {}).get(cold, 4.0), 2, b200_primes, log))
                logs.append(log)
                print(f"  cold {cold:.0%} {name} seed {s}: {got[-1]} | " + "; ".join(
                    f"{p['rate']} {'ok' if p['met'] else 'MISS'} w{_f(p['warm_ttft_p90_s'])} "
                    f"c{_f(p['cold_ttft_p90_s'])}" for p in log), flush=True)
            row[name] = {"runs": got, "median": statistics.median(got), "spread": [min(got), max(got)],
                         "points": logs}
        base = max((v["median"] for k, v in row.items() if k != "cpd"), default=0.0)
        row["cpd_vs_best_baseline"] = row["cpd"]["median"] / base if base and "cpd" in row else None
        out[str(cold)] = row
        if out_path:
            out_path.write_text(json.dumps(out, indent=1))
        print(f"cold {cold:.0%}: " + ", ".join(f"{k} {v['median']} {v['spread']}" for k, v in row.items()
                                              if isinstance(v, dict)) + f" | cpd/best {row['cpd_vs_best_baseline']}",
              flush=True)
    return out


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="share,drift,decide")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals per rate point")
    p.add_argument("--drift-rate", type=float, default=8.0, help="sessions/s in the drift run")
    p.add_argument("--drift-phase", type=float, default=120.0, help="seconds per phase of the drift run")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/policies.json"))
    p.add_argument("--profile", choices=("cpu", "b200"), default="cpu",
                   help="share part: this machine's validated CPU profile, or the simulated B200 cluster of "
                        "`warmpath repro cpd` (12 GPUs, 64K-token contexts)")
    p.add_argument("--shares", default=None, help="share part: cold shares to run (default 0,0.1,0.25,0.5,0.75)")
    p.add_argument("--configs", default=None, help="share part, b200: configurations (default cpd,pd,pd-kv,replica)")
    p.add_argument("--max-in-flight", type=int, default=None,
                   help="share part, b200: a fixed router admission limit (default: sized to the fleet)")
    a = p.parse_args()
    res = {"slo": {"warm_ttft_p90_s": real.SLO["warm"], "cold_ttft_p90_s": real.SLO["cold"],
                   "success": real.TARGET.min_success, "target": real.TARGET.to_json()},
           "command": " ".join(sys.argv)}
    if "share" in a.parts and a.profile == "b200":
        shares = tuple(float(x) for x in a.shares.split(",")) if a.shares else SHARES
        res["profile"] = {"hardware": "b200", "model": "llama-3.1-8b", "configs": {
            k: {"workers": t.workers, "policy": t.policy, "tp": B200_TP} for k, t in B200_CONFIGS.items()},
            "workload": {**B200_AGENT, "primed": True}, "max_in_flight": a.max_in_flight or "fleet", "block_size": 256,
            "rates": B200_RATES, "first_tried": B200_GUESS, "duration_s": a.duration}
        a.out.parent.mkdir(parents=True, exist_ok=True)
        res["share"] = part_share_b200(a.seeds, a.duration, shares, a.configs.split(",") if a.configs else None,
                                       B200_GUESS, a.out.with_suffix(".partial.json"), a.max_in_flight)
    elif "share" in a.parts:
        prof = val.cpu_profile(Path("benchmarks/results/cluster/calibration_insitu.json"),
                               Path("benchmarks/results/cluster/calibration_traced.json"),
                               Path("benchmarks/results/request_overhead.json"),
                               Path("benchmarks/results/answer_retokenize.json"))
        res["share"] = part_share(prof, a.seeds, a.duration)
    if "drift" in a.parts:
        res["drift"] = part_drift(a.drift_rate, a.drift_phase, 0)
        plot_drift(res["drift"], a.drift_phase, a.out.with_name(a.out.stem + "_drift.png"))
    if "decide" in a.parts:
        res["decide"] = decide.part_decide()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

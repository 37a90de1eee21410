"""``warmpath plan``'s side of ``benchmarks/policies/ranking.py``: its 2-GPU (here: 2-core) TP1
candidates on the same CPU profile (``ranking_sim.cpu_setup``), the same workload, priming,
seeds and joint target, each rate on a fresh primed cluster (what ``plan`` does), and ``plan()``
itself over every 2-worker candidate — its recommendation."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common.workload import agent
from benchmarks.sim_accuracy.sim_validation import primes
from warmpath.plan.evaluate import SimEvaluator
from warmpath.plan.search import PlanConfig, plan
from warmpath.plan.space import candidates

# ranking arm -> plan's candidate (2 workers of one core each)
CANDIDATES = {"replica-2": "replica 2r tp1", "pd-1p1d": "pd 1p+1d tp1", "pd-1p1d@dynamic": "pd 1p+1d tp1 ppd-dynamic"}


def plan_candidates() -> dict:
    """Every candidate ``warmpath plan`` tries on 2 GPUs of TP 1, PPD dynamic on PD splits."""
    return {c.name: c for c in candidates(2, (1,), ppd_modes=("off", "dynamic"))}


def evaluator(calibration: Path, timeout: float, target, duration: float, seed: int, workload_seed: int,
              decode_factor: float = 1.0):
    from benchmarks.policies.ranking_sim import cpu_setup

    return SimEvaluator(cpu_setup(calibration, timeout, decode_factor), target, make=agent, duration_s=duration, seed=seed,
                        prime=primes, workload_seed=workload_seed, roofline_ppd=False)


def plan_arm(arm: str, seed: int, rates: list[float], duration: float, timeout: float, targets: dict,
             calibration: Path, sim_seeds: int, decode_factor: float = 1.0) -> dict:
    """Per target: the goodput of ``sim_seeds`` evaluations (scatter seeds) at each rate, each
    rate on a fresh primed cluster, and their median."""
    cand = plan_candidates()[CANDIDATES[arm]]
    per_run = []
    for k in range(sim_seeds):
        got = {}
        for n, t in targets.items():
            ev = evaluator(calibration, timeout, t, duration, k, seed, decode_factor)
            best = None
            for r in rates:
                if not ev(cand, r / cand.gpus, True)["slo_met"]:
                    break
                best = r
            got[n] = best
        per_run.append(got)
    med = {n: statistics.median([g[n] or 0.0 for g in per_run]) for n in targets}
    print(f"plan {cand.name} seed {seed}: {per_run}", flush=True)
    return {"candidate": cand.name, "goodput_runs": per_run, "goodput": med}


def recommend(rates: list[float], duration: float, timeout: float, target, calibration: Path, seed: int,
              decode_factor: float = 1.0) -> dict:
    """``plan()`` over every 2-worker candidate, the grid per GPU, no screen: its recommendation."""
    cfg = PlanConfig(2, tuple(x / 2 for x in rates), tp_set=(1,), ppd_modes=("off", "dynamic"), screen_requests=0,
                     bisect=0, seed=0)
    res = plan(list(plan_candidates().values()), evaluator(calibration, timeout, target, duration, 0, seed,
                                                           decode_factor), cfg, "sessions/s", say=lambda m: None)
    return {"recommended": res["recommended"], "runner_up": res["runner_up"],
            "rows": [{k: r[k] for k in ("candidate", "sustained_rate", "headroom")} for r in res["rows"]]}

"""The simulator's side of ``benchmarks/policies/ranking.py``: the same arms, seeds, rates and
procedure on the CPU profile a user gets from ``warmpath calibrate`` (as ``warmpath bench --sim``
builds it, with the real arms' worker flags: 0.5 GiB L1 + 0.5 GiB L2 per worker, a 2 GiB store),
and the rankings of both sides."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks.sim_accuracy.sim_validation import simulate_sweep
from warmpath.launch.topology import Topology
from warmpath.sim.cli import add_parser, setup_from_args


def cpu_setup(calibration: Path, timeout: float):
    """``warmpath sim --hardware cpu --calibration FILE`` with the arms' worker flags."""
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    a = p.parse_args(["sim", "--workload", "coding-agent", "--topology", "replica-2", "--hardware", "cpu",
                      "--model", "smollm2-135m", "--calibration", str(calibration), "--kv-gib", "0.5",
                      "--l2-gib", "0.5"])
    a.timeout = timeout
    return replace(setup_from_args(a), l3_gib=2.0)


def sim_sweep(setup, seed: int, rates: list[float], duration: float, targets: dict) -> dict[float, dict]:
    """The real procedure on one simulated cluster (``sim_validation.simulate_sweep``: primed,
    each rate after the previous drained, ``run_rate``'s arrivals and sessions for ``seed``);
    per rate the verdicts of both targets."""
    from benchmarks.policies.ranking import verdicts

    return simulate_sweep(setup, rates, duration, seed, lambda recs, dur, rate: verdicts(recs, dur, rate, targets))


def sim_arm(topo: Topology, seed: int, rates: list[float], duration: float, timeout: float, targets: dict,
            calibration: Path, sim_seeds: int) -> dict:
    """``sim_seeds`` simulated runs (seeds of the step scatter) of one arm at one arrival seed:
    each run's goodput per target, and the median."""
    from benchmarks.policies.ranking import goodputs

    base = replace(cpu_setup(calibration, timeout), topology=topo)
    if topo.policy == "goodput":   # it routes for the joint target, as its real router does
        base = replace(base, target=targets["joint"])
    runs = [sim_sweep(replace(base, seed=k), seed, rates, duration, targets) for k in range(sim_seeds)]
    per_run = [goodputs(r) for r in runs]
    med = {n: statistics.median([g[n] or 0.0 for g in per_run]) for n in targets}
    for n in targets:
        print(f"sim {topo.name} seed {seed}: {n} goodput per scatter seed {[g[n] for g in per_run]}", flush=True)
    return {"points": [{str(r): v for r, v in run.items()} for run in runs], "goodput_runs": per_run, "goodput": med}


def rankings(result: dict, arms: list[str], seeds: list[int]) -> dict:
    """Per part and target: each arm's goodput per seed, the median, and the order (best
    first; ties keep ``arms``' order); ``sim_agrees`` / ``plan_agrees``: whether that side
    orders every pair of arms as the real runs do, ties included (:func:`same_order`)."""
    out: dict = {}
    for part in ("real", "sim", "plan"):
        got = result.get(part)
        if not got:
            continue
        present = [arm for arm in arms if any(f"{arm}/{s}" in got for s in seeds)]
        for n in ("joint", "ttft"):
            per = {arm: [(got.get(f"{arm}/{s}") or {}).get("goodput", {}).get(n) for s in seeds] for arm in present}
            med = {arm: statistics.median([x or 0.0 for x in xs]) for arm, xs in per.items()}
            order = sorted(present, key=lambda a: -med[a])
            out.setdefault(part, {})[n] = {"per_seed": per, "median": med, "order": order}
    for part in ("sim", "plan"):
        if "real" in out and part in out:
            common = [a for a in out["real"]["joint"]["median"] if a in out[part]["joint"]["median"]]
            out[f"{part}_agrees"] = {n: same_order({a: out["real"][n]["median"][a] for a in common},
                                                   {a: out[part][n]["median"][a] for a in common})
                                     for n in ("joint", "ttft")}
    return out


def same_order(a: dict, b: dict) -> bool:
    """Every pair of keys compares the same way (<, =, >) in ``a`` as in ``b``."""
    sign = lambda x: (x > 0) - (x < 0)
    ks = list(a)
    return all(sign(a[x] - a[y]) == sign(b[x] - b[y]) for i, x in enumerate(ks) for y in ks[i + 1:])

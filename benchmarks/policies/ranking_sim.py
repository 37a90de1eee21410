"""The simulator's side of ``benchmarks/policies/ranking.py``: the same arms, seeds, rates and
procedure on the CPU profile a user gets from ``warmpath calibrate`` (as ``warmpath bench --sim``
builds it, with the real arms' worker flags: 0.5 GiB L1 + 0.5 GiB L2 per worker, a 2 GiB store),
and the rankings of both sides.

Pinned workers decode slower than the calibration's steps say (issue 28: a lone decode served
at 0.074-0.131 s per token where the calibrated line gives ~0.058 s; prefills as calibrated), and a
session's next turn is sent when its answer ends, so a too-fast decode sends follow-ups ahead of
the documents they queue behind on the real cluster. :func:`served_decode_factor` measures the
correction on the unloaded run the ranking takes first (seed 900, never a benchmark's): the
real median TPOT over the simulated one of the same sessions (``StepModel.decode_factor``).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks.common.workload import agent
from benchmarks.policies import ranking_target
from benchmarks.policies.ranking_target import goodputs, verdicts
from benchmarks.sim_accuracy.sim_validation import primes, simulate_sweep
from warmpath.launch.topology import Topology
from warmpath.sim.cli import add_parser, setup_from_args
from warmpath.sim.run import build


def sim_flags(worker_args: list[str]) -> list[str]:
    """The workers' flags the simulator models too (``--kv-dtype``, ``--kv-l3-overlap``, as
    ``FLAG VALUE`` or ``FLAG=VALUE``), from ``ranking --worker-arg``'s list; others are left out."""
    out, args = [], list(worker_args)
    for i, arg in enumerate(args):
        flag, eq, val = arg.partition("=")
        if flag in SIM_WORKER_FLAGS:
            if not eq and i + 1 >= len(args):
                raise ValueError(f"--worker-arg {flag} needs a value")
            out += [flag, val if eq else args[i + 1]]
    return out


SIM_WORKER_FLAGS = ("--kv-dtype", "--kv-l3-overlap")


def cpu_setup(calibration: Path, timeout: float, decode_factor: float = 1.0, worker_args: list[str] | None = None):
    """``warmpath sim --hardware cpu --calibration FILE`` with the arms' worker flags (those of
    ``worker_args`` the simulator models, ``sim_flags``; None: the ranking run's ``--worker-arg``
    list, ``ranking_target.WORKER_ARGS``); the calibration's decodes priced ``decode_factor`` times
    (``StepModel.decode_factor``)."""
    if worker_args is None:
        worker_args = ranking_target.WORKER_ARGS
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    a = p.parse_args(["sim", "--workload", "coding-agent", "--topology", "replica-2", "--hardware", "cpu",
                      "--model", "smollm2-135m", "--calibration", str(calibration), "--kv-gib", "0.5",
                      "--l2-gib", "0.5", *sim_flags(worker_args)])
    a.timeout = timeout
    s = setup_from_args(a)
    return replace(s, l3_gib=2.0, fitted=replace(s.fitted, decode_factor=s.fitted.decode_factor * decode_factor))


def unloaded_tpots(setup, topo: Topology, sessions: int, gap: float) -> list[float]:
    """The per-request TPOTs of ``ranking.unloaded_tpot``'s procedure on the simulator: ``topo``
    primed, then ``sessions`` of the workload (seed 900), one starting every ``gap`` seconds."""
    sim = build(replace(setup, topology=topo))
    seen = len(sim.run(primes()))
    fixed = agent(sessions, 900)
    for i, s in enumerate(fixed):
        s.start = sim.now + 1.0 + gap * i
    return [r.tpot for r in sim.run(fixed)[seen:] if r.ok and r.tpot]


def served_decode_factor(unloaded_tpot_s: float, setup, topo: Topology, sessions: int, gap: float) -> float:
    """The served decodes' cost over the calibrated ones: the real unloaded run's median TPOT
    over the median of the same run simulated with ``setup`` as calibrated. One sequence decodes
    at a time there, so every TPOT is ``decode_s(1, context)`` of its contexts and the ratio is
    the factor that makes the simulated median the real one."""
    base = replace(setup, fitted=replace(setup.fitted, decode_factor=1.0))
    return unloaded_tpot_s / statistics.median(unloaded_tpots(base, topo, sessions, gap))


def sim_sweep(setup, seed: int, rates: list[float], duration: float, targets: dict) -> dict[float, dict]:
    """The real procedure on one simulated cluster (``sim_validation.simulate_sweep``: primed,
    each rate after the previous drained, ``run_rate``'s arrivals and sessions for ``seed``);
    per rate the verdicts of both targets."""
    return simulate_sweep(setup, rates, duration, seed, lambda recs, dur, rate: verdicts(recs, dur, rate, targets))


def sim_arm(topo: Topology, seed: int, rates: list[float], duration: float, timeout: float, targets: dict,
            calibration: Path, sim_seeds: int, decode_factor: float = 1.0) -> dict:
    """``sim_seeds`` simulated runs (seeds of the step scatter) of one arm at one arrival seed:
    each run's goodput per target, and the median."""
    base = replace(cpu_setup(calibration, timeout, decode_factor), topology=topo)
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

"""Which split wins under a TTFT *and* TPOT target on this machine: 2 replicas vs 1P1D vs 1P1D
with dynamic PPD, each worker pinned to its own core, on the real engine and on the simulator.

Target, stated before measuring (issue 28): warm TTFT p90 <= 2 s, cold TTFT p90 <= 20 s and
per-request TPOT p90 <= 1.5x the unloaded TPOT, >= 90% of the requests of every class attaining
their bounds (DistServe's goodput share) and >= 99% succeeding (``slo.py``). The
unloaded TPOT is measured first: the median per-request TPOT of 10 sessions of the workload
started 20 s apart (nothing else in flight) on the replica arm. Beside it the TTFT-only target
(``CLUSTER_TARGET``) is judged on the same requests. Goodput: the highest offered rate meeting
the target with every lower rate meeting it (``targets.highest_met``).

Workload: ``benchmarks/common/workload.agent`` (3 primed 1,536-token repositories, 25% new
2,048-token documents, 1-3 turns, 32-token answers), arrivals from ``--seeds``; each arm is
started fresh per seed and primed; then each rate's points run one arm after the other, in an
order rotated from rate to rate, every arm's cluster up meanwhile (an arm stops once it missed
both targets; ``--sequential``: each arm's whole sweep in turn, as before 6 December), so the
host's drift is shared by the arms. TTFT is timed from arrival; the client times out at
``--timeout`` (a failure).
Part ``sim`` replays the same arms, seeds and rates on the simulator's CPU profile built from
``warmpath calibrate``'s output (``--calibration``), as a user gets it, its decodes priced as the
pinned workers served them in the unloaded run (``--sim-decode served``; ``ranking_sim``).
``--redo`` recomputes the parts asked for where ``ranking.json`` holds them already.

    python -m benchmarks.policies.ranking [--parts real,sim] [--seeds 11,12,13]
        [--rates 0.05,0.1,0.15,0.2] [--duration 60] [--out benchmarks/results/ranking]
        [--sim-decode served|calibrated] [--redo]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common.results import read_json, stored
from benchmarks.common.workload import WORKERS, agent, prime
from benchmarks.policies.ranking_plan import CANDIDATES
from benchmarks.policies.ranking_target import WORKER_ARGS, goodputs, joint_target, records, verdicts
from warmpath.bench.runner import OpenAITarget
from warmpath.bench.sweep import run_rate, sweep_summary, write_results
from warmpath.slo import CLUSTER_TARGET
from warmpath.launch import launcher
from warmpath.launch.topology import Topology
from warmpath.models.loader import load_tokenizer
from warmpath.procs import free_port

ARMS = {
    "replica-2": Topology("replica-2", "replica", {"replica": 2}, cpus={"replica-0": "0", "replica-1": "1"}),
    "pd-1p1d": Topology("pd-1p1d", "pd", {"prefill": 1, "decode": 1}, cpus={"prefill-0": "0", "decode-0": "1"}),
    "pd-1p1d@dynamic": Topology("pd-1p1d@dynamic", "pd", {"prefill": 1, "decode": 1}, "dynamic",
                                cpus={"prefill-0": "0", "decode-0": "1"}),
}
# issue 29's per-request path decision on the same two cores, routing for the joint target; its
# router gets that target (``--slo``) and the calibration's step model (``--calibration``)
ARMS["goodput-1p1d"] = Topology("goodput-1p1d", "goodput", {"prefill": 1, "decode": 1},
                                cpus={"prefill-0": "0", "decode-0": "1"})


def start(topo: Topology, router_argv: tuple = ()):
    return launcher.start(topo, "127.0.0.1", free_port(), [*WORKERS, *WORKER_ARGS], ["--model", "smollm2", *router_argv],
                          None, 2.0, 1)


def router_argv(topo: Topology, targets: dict, calibration: Path) -> tuple:
    """A ``goodput`` router routes for the joint target with the calibration's step model;
    the fixed arms' routers run as ``warmpath serve`` does by default (the online model)."""
    return ("--slo", targets["joint"].spec(), "--calibration", str(calibration)) if topo.policy == "goodput" else ()


def unloaded_tpot(sessions: int, gap: float, timeout: float, encode, out: Path) -> float:
    """Median per-request TPOT on the replica arm with nothing else running: ``sessions`` of the
    workload (seed 900, no benchmark's), one starting every ``gap`` seconds (a session's turns
    follow each other at once, as in the benchmark)."""
    c = start(ARMS["replica-2"])
    try:
        prime(c.url)
        fixed = agent(sessions, 900)
        for i, s in enumerate(fixed):
            s.start = gap * i

        async def go():
            t = OpenAITarget(c.url, timeout_s=timeout)
            try:
                return await run_rate(t, agent, None, None, CLUSTER_TARGET, seed=900, encode=encode, quiet=True,
                                      fixed=fixed)
            finally:
                await t.close()
        res = asyncio.run(go())
    finally:
        c.stop()
    tpots = [r["tpot_s"] for r in res["requests"] if r["ok"] and r["tpot_s"]]
    (out / "unloaded.json").write_text(json.dumps({"tpots": tpots, "median": statistics.median(tpots)}, indent=1))
    return statistics.median(tpots)


class ArmRun:
    """One arm's cluster for one seed: started fresh and primed, then run point by point (each
    rate a fresh client) until both targets miss; :meth:`finish` stops it and writes its runs."""

    def __init__(self, name: str, seed: int, targets: dict, calibration: Path) -> None:
        self.name, self.seed, self.targets = name, seed, targets
        self.runs, self.points, self.started = {}, {}, {}
        self.c = start(ARMS[name], router_argv(ARMS[name], targets, calibration))
        try:
            prime(self.c.url)
        except BaseException:
            self.c.stop()
            raise

    @property
    def going(self) -> bool:
        """Not stopped yet: no rate run, or the last one met a target."""
        return not self.points or any(v["met"] for v in self.points[max(self.points)].values())

    def point(self, rate: float, duration: float, timeout: float, encode) -> None:
        """The point at ``rate`` (its wall-clock start kept: ``started``)."""
        async def go():
            t = OpenAITarget(self.c.url, timeout_s=timeout)
            try:
                return await run_rate(t, agent, rate, duration, self.targets["joint"], seed=self.seed, encode=encode,
                                      quiet=True)
            finally:
                await t.close()
        t0 = time.time()
        self.started[rate] = t0
        res = self.runs[rate] = asyncio.run(go())
        self.points[rate] = verdicts(records(res["requests"]), res["duration_s"], rate, self.targets)
        show(self.name, self.seed, rate, self.points[rate], time.time() - t0)

    def finish(self, out: Path) -> dict:
        """Stop the cluster; write its runs (``out/<arm>_s<seed>``); its points and goodputs."""
        self.c.stop()
        write_results(out / f"{self.name}_s{self.seed}", {"target": self.name,
                                                          **sweep_summary(self.runs, self.targets["joint"])})
        return {"points": self.points, "goodput": goodputs(self.points),
                "started": {str(r): t for r, t in self.started.items()}}


def rotated(arms: list[str], k: int) -> list[str]:
    """``arms`` starting at its ``k``-th (mod its length): the order of one rate's points."""
    k %= max(1, len(arms))
    return arms[k:] + arms[:k]


def real_seed(names: list[str], seed: int, rates: list[float], duration: float, timeout: float, targets: dict,
              encode, out: Path, calibration: Path, interleave: bool = True) -> dict:
    """The arms ``names`` on one seed. Interleaved (the default): every arm's cluster up at once
    (the idle ones wait), each rate's points run one arm after the other in an order rotated
    from rate to rate, so a host that speeds up or slows down over the sweep (it does, by up to
    a quarter within an hour: ``docs/benchmarks/sim_accuracy.md``) is shared by the arms rather
    than landing on one; otherwise each arm's whole sweep in turn, as before."""
    if not interleave:
        return {n: real_seed([n], seed, rates, duration, timeout, targets, encode, out, calibration)[n]
                for n in names}
    runs: dict[str, ArmRun] = {}
    try:
        for n in names:
            runs[n] = ArmRun(n, seed, targets, calibration)
        for i, r in enumerate(rates):
            for n in rotated(names, i + seed):
                if runs[n].going:
                    runs[n].point(r, duration, timeout, encode)
    finally:
        got, failed = {}, []
        for n, run in runs.items():   # every cluster stops, even when one's finish fails
            try:
                got[n] = run.finish(out)
            except Exception as e:   # noqa: BLE001 - re-raised below, once the others have stopped
                failed.append(e)
    if failed:
        raise failed[0]
    return got


def show(name: str, seed: int, rate: float, v: dict, wall: float) -> None:
    f = lambda x: "-" if x is None else f"{x:.2f}"
    j = v["joint"]
    print(f"{name} seed {seed} rate {rate}: warm p90 {f(j['warm_ttft_p90_s'])} cold p90 {f(j['cold_ttft_p90_s'])}"
          f" TPOT p90 {f(j['tpot_p90_s'])} success {f(j['success'])} | joint {'met' if j['met'] else 'missed'}, "
          f"ttft-only {'met' if v['ttft']['met'] else 'missed'} ({wall:.0f} s)", flush=True)


def parser() -> argparse.ArgumentParser:
    """The command line of this benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="real,sim,plan", help="real: the cluster; sim: `bench --sim`'s "
                   "procedure; plan: `warmpath plan`'s evaluator and its recommendation")
    p.add_argument("--arms", default="replica-2,pd-1p1d,pd-1p1d@dynamic", help=f"of {sorted(ARMS)}")
    p.add_argument("--seeds", default="11,12,13")
    p.add_argument("--rates", default="0.05,0.1,0.15,0.2")
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--timeout", type=float, default=120.0,
                   help="client timeout (s; the simulator cuts at it too): a cold prompt can queue behind two "
                        "documents of ~7 s each on one core, so `bench`'s 30 s would turn queueing into failures")
    p.add_argument("--unloaded", type=float, help="the unloaded TPOT (s); measured first when not given")
    p.add_argument("--unloaded-sessions", type=int, default=10)
    p.add_argument("--unloaded-gap", type=float, default=20.0, help="seconds between the unloaded sessions' starts")
    p.add_argument("--calibration", type=Path, default=Path("benchmarks/results/sim_accuracy/calibration.json"))
    p.add_argument("--sim-seeds", type=int, default=3, help="simulated runs per real run (seeds of the step scatter)")
    p.add_argument("--sim-decode", choices=("served", "calibrated"), default="served",
                   help="sim and plan parts: decodes priced as the unloaded run served them (the real median "
                        "TPOT over the simulated one, ranking_sim.served_decode_factor) or as calibrated")
    p.add_argument("--redo", action="store_true", help="recompute the parts asked for even where ranking.json has them")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/ranking"))
    p.add_argument("--sequential", action="store_true",
                   help="real part: each arm's whole sweep in turn (the default interleaves a seed's arms point "
                        "by point, real_seed)")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="an extra flag for every worker (repeat; e.g. --worker-arg=--kv-l3-overlap --worker-arg=on)")
    return p


def main() -> int:
    p = parser()
    a = p.parse_args()
    arms = a.arms.split(",")
    WORKER_ARGS[:] = a.worker_arg
    if bad := [x for x in arms if x not in ARMS]:
        p.error(f"--arms: unknown {bad}; known: {sorted(ARMS)}")
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "ranking.json"
    result = read_json(path) if stored(path) else {}   # a kept ranking.json may be gzipped
    seeds = [int(x) for x in a.seeds.split(",")]
    rates = [float(x) for x in a.rates.split(",")]
    encode = functools.partial(load_tokenizer().encode, add_special=False)
    unloaded = a.unloaded or result.get("unloaded_tpot_s") or unloaded_tpot(a.unloaded_sessions, a.unloaded_gap, a.timeout, encode,
                                                                          a.out)
    targets = {"joint": joint_target(unloaded), "ttft": CLUSTER_TARGET}
    command = " ".join(["python", "-m", "benchmarks.policies.ranking", *sys.argv[1:]])
    earlier = result.get("commands") or ([result["command"]] if "command" in result else [])
    result.update({"command": command, "commands": [*earlier, command], "unloaded_tpot_s": unloaded,
                   "targets": {k: t.to_json() for k, t in targets.items()}, "rates": rates, "duration_s": a.duration,
                   "timeout_s": a.timeout})
    print(f"unloaded TPOT {unloaded:.4f} s → joint target {targets['joint'].to_json()}", flush=True)
    parts = a.parts.split(",")
    if a.redo:
        for part in parts:
            result.pop(part, None)
        if "plan" in parts:
            result.pop("recommended", None)
    factor = 1.0
    if a.sim_decode == "served" and {"sim", "plan"} & set(parts):
        from benchmarks.policies.ranking_sim import cpu_setup, served_decode_factor
        factor = served_decode_factor(unloaded, cpu_setup(a.calibration, a.timeout), ARMS["replica-2"],
                                      a.unloaded_sessions, a.unloaded_gap)
        print(f"sim and plan: decodes priced {factor:.3f}x the calibration's (the unloaded run served)", flush=True)
    if {"sim", "plan"} & set(parts):
        result["sim_decode_factor"] = factor
    for part in parts:
        for seed in seeds:
            if part == "real":
                todo = [arm for arm in arms if f"{arm}/{seed}" not in result.get(part, {})]
                got = real_seed(todo, seed, rates, a.duration, a.timeout, targets, encode, a.out / "real",
                                a.calibration, not a.sequential) if todo else {}
                result.setdefault(part, {}).update({f"{arm}/{seed}": v for arm, v in got.items()})
                path.write_text(json.dumps(result, indent=1))
                continue
            for arm in arms:
                key = f"{arm}/{seed}"
                if key in result.get(part, {}):
                    continue
                if part == "sim":
                    from benchmarks.policies.ranking_sim import sim_arm
                    got = sim_arm(ARMS[arm], seed, rates, a.duration, a.timeout, targets, a.calibration, a.sim_seeds,
                                  factor)
                elif arm in CANDIDATES:   # plan's space has no goodput candidate
                    from benchmarks.policies.ranking_plan import plan_arm
                    got = plan_arm(arm, seed, rates, a.duration, a.timeout, targets, a.calibration, a.sim_seeds,
                                   factor)
                else:
                    continue
                result.setdefault(part, {})[key] = got
                path.write_text(json.dumps(result, indent=1))
    if "plan" in parts and "recommended" not in result:
        from benchmarks.policies.ranking_plan import recommend
        result["recommended"] = {str(s): recommend(rates, a.duration, a.timeout, targets["joint"], a.calibration, s,
                                                   factor) for s in seeds}
    from benchmarks.policies.ranking_sim import rankings
    result["rankings"] = rankings(result, arms, seeds)
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["rankings"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

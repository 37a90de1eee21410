"""One point of ``warmpath plan``: a candidate topology at one load, in the simulator (no torch).

A trace is replayed whole (or its first ``screen_requests``) at ``load``× its own arrival
rate (``bench/replay.py``); a workload runs ``load`` sessions/s per GPU for ``duration_s`` (or
``screen_duration_s``). Every run stops as soon as its SLO can no longer be met.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from warmpath.bench.metrics import SLOMissWatch
from warmpath.bench.replay import TracePoint, own_rate, replay
from warmpath.bench.workload import Session
from warmpath.sim.plan_space import Candidate
from warmpath.sim.run import GIB, SimSetup, simulate_rate

_METRIC = {"ttft": "ttft_p90_s", "ttft_p50": "ttft_p50_s", "ttft_p90": "ttft_p90_s", "ttft_p99": "ttft_p99_s",
           "tpot": "tpot_s", "itl": "itl_s", "e2e": "e2e_p50_s"}


def fits(setup: SimSetup, tp: int) -> bool:
    """The model's weights fit ``tp`` GPUs with room left for KV (as ``sim/run.build`` sizes L1)."""
    return setup.hardware.hbm_gib * tp * 0.9 * GIB - setup.model.weight_bytes >= setup.block_size * \
        setup.model.kv_bytes_per_token * 64


def headroom(classes: dict, slo: dict) -> float | None:
    """The SLO's tightest metric over its limit (1 = at the limit; lower is more headroom)."""
    vals = [classes["all"][_METRIC[k]] / v for k, v in slo.items() if classes["all"][_METRIC[k]] is not None]
    return max(vals) if vals else None


@functools.lru_cache(maxsize=None)
def _ppd_table(hw, model, tp: int):
    from warmpath.sim.repro import ppd_table_for   # the roofline's PPD table (what `calibrate` measures)

    return ppd_table_for(hw, model, tp)[0]


@dataclass
class SimEvaluator:
    """``base``: every setting but the topology and TP. ``trace`` or ``make`` (workload sessions)."""

    base: SimSetup
    slo: dict
    trace: list[Session] | None = None
    make: object = None
    duration_s: float = 120.0
    ramp_s: float = 0.0
    screen_requests: int = 400
    screen_duration_s: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        self.own = own_rate(self.trace) if self.trace is not None else None

    @property
    def multi_turn(self) -> bool:
        """Whether any session has a second turn (PPD only changes turns 2+)."""
        if self.trace is not None:
            return any(len(s.turns) > 1 for s in self.trace)
        return any(len(s.turns) > 1 for s in self.make(20, self.seed))

    def setup(self, cand: Candidate) -> SimSetup:
        table = _ppd_table(self.base.hardware, self.base.model, cand.tp["decode"]) if cand.ppd == "dynamic" else None
        return replace(self.base, topology=cand.topology(), tp=cand.tp, ppd_table=table, seed=self.seed)

    def __call__(self, cand: Candidate, load: float, whole: bool) -> dict:
        setup = self.setup(cand)
        if self.trace is not None:
            trace = self.trace if whole or not self.screen_requests else self.trace[:self.screen_requests]
            sessions, _ = replay(trace, TracePoint(load * self.own, load), None, say=lambda m: None)
            watch = SLOMissWatch(self.slo, sum(len(s.turns) for s in sessions))
            res = simulate_rate(setup, lambda n, s: sessions, load * self.own, 0.0, self.slo, seed=self.seed,
                                fixed_arrivals=True, stop=watch)
            rate, n = load * self.own, len(sessions)
        else:
            watch = SLOMissWatch(self.slo, 0)

            def make(n: int, seed: int) -> list[Session]:
                ss = self.make(n, seed)
                watch.most = sum(len(s.turns) for s in ss)
                return ss
            rate = load * cand.gpus
            dur = self.duration_s if whole else self.screen_duration_s
            res = simulate_rate(setup, make, rate, dur, self.slo, self.ramp_s, seed=self.seed, stop=watch)
            n = res["sessions"]
        a = res["classes"]["all"]
        return {"rate": rate, "slo_met": res["slo_met"], "ttft_p90_s": a["ttft_p90_s"], "tpot_s": a["tpot_s"],
                "success_rate": a["success_rate"], "headroom": headroom(res["classes"], self.slo),
                "stopped_at_s": res["sim"]["stopped_at_s"], "sessions": n, "events": res["sim"]["events"]}

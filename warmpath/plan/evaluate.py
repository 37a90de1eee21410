"""One point of ``warmpath plan``: a candidate topology at one load, in the simulator (no torch).

A trace is replayed whole (or its first ``screen_requests``) at ``load``× its own arrival
rate (``bench/replay.py``); a workload runs ``load`` sessions/s per GPU for ``duration_s`` (or
``screen_duration_s``). Every run stops as soon as its SLO can no longer be met. To mirror a
benchmark of the real cluster (``benchmarks/sim_accuracy/plan_vs_real.py``) a workload point can also be
primed (``prime``), seeded as the benchmark seeds it (``workload_seed``), held to a TTFT p90
per request class (``class_slo``: warm and cold) and run PPD ``dynamic`` without an offline
table (``roofline_ppd=False``: the router's online model, as served without a calibration file).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

from warmpath.bench.arrivals import session_seed
from warmpath.bench.metrics import SLOMissWatch
from warmpath.slo import Target
from warmpath.bench.replay import TracePoint, own_rate, replay
from warmpath.bench.workload import Session
from warmpath.plan.space import Candidate
from warmpath.sim.run import GIB, SimSetup, simulate_rate

def fits(setup: SimSetup, tp: int) -> bool:
    """The model's weights fit ``tp`` GPUs with room left for KV (as ``sim/run.build`` sizes L1)."""
    room = setup.hardware.hbm_gib * tp * setup.memory_share() * GIB - setup.model.weight_bytes
    return room >= setup.block_size * setup.model.kv_bytes_per_token * 64


def with_classes(slo, class_slo: dict | None) -> Target:
    """``slo`` (a :class:`Target` or its older forms) with a TTFT p90 bound per class of
    ``class_slo`` (class -> seconds) added."""
    t = Target.of(slo)
    if not class_slo:
        return t
    return Target.from_items([*t.flat().items(), *((f"{c}.ttft_p90", v) for c, v in class_slo.items()),
                              ("attain", t.attain), ("success", t.min_success)])


@functools.lru_cache(maxsize=None)
def _ppd_table(hw, model, tp: int):
    from warmpath.sim.repro import ppd_table_for   # the roofline's PPD table (what `calibrate` measures)

    return ppd_table_for(hw, model, tp)[0]


@dataclass
class SimEvaluator:
    """``base``: every setting but the topology and TP. ``trace`` or ``make`` (workload sessions).
    ``slo``: the :class:`~warmpath.slo.Target` (or its flat dict); ``class_slo``:
    TTFT p90 limits per class added to it (e.g. ``{"warm": 2, "cold": 20}``; the older form of
    ``warm.ttft_p90=2,cold.ttft_p90=20``); no early stop with per-class bounds. ``prime``: sessions run first
    on each fresh cluster, outside the statistics. ``workload_seed``: arrivals seeded by it and
    sessions by ``bench/arrivals.session_seed`` (as ``warmpath bench``); ``seed`` then seeds only
    the step scatter. ``roofline_ppd``: PPD ``dynamic`` with the roofline's table (else none)."""

    base: SimSetup
    slo: dict
    trace: list[Session] | None = None
    make: object = None
    duration_s: float = 120.0
    ramp_s: float = 0.0
    screen_requests: int = 400
    screen_duration_s: float = 30.0
    seed: int = 0
    class_slo: dict | None = None
    prime: Callable[[], list[Session]] | None = None
    workload_seed: int | None = None
    roofline_ppd: bool = True

    def __post_init__(self) -> None:
        self.target = with_classes(self.slo, self.class_slo)
        self.own = own_rate(self.trace) if self.trace is not None else None

    @property
    def multi_turn(self) -> bool:
        """Whether any session has a second turn (PPD only changes turns 2+)."""
        if self.trace is not None:
            return any(len(s.turns) > 1 for s in self.trace)
        return any(len(s.turns) > 1 for s in self.make(20, self.seed))

    def setup(self, cand: Candidate) -> SimSetup:
        table = (_ppd_table(self.base.hardware, self.base.model, cand.tp["decode"])
                 if cand.ppd == "dynamic" and self.roofline_ppd else None)
        return replace(self.base, topology=cand.topology(), tp=cand.tp, ppd_table=table, seed=self.seed)

    def __call__(self, cand: Candidate, load: float, whole: bool) -> dict:
        setup = self.setup(cand)
        if self.trace is not None:
            trace = self.trace if whole or not self.screen_requests else self.trace[:self.screen_requests]
            sessions, _ = replay(trace, TracePoint(load * self.own, load), None, say=lambda m: None)
            watch = SLOMissWatch(self.target, sum(len(s.turns) for s in sessions))
            res = simulate_rate(setup, lambda n, s: sessions, load * self.own, 0.0, self.target, seed=self.seed,
                                fixed_arrivals=True, stop=watch)
            rate, n = load * self.own, len(sessions)
        else:
            per_class = any(c != "all" for c, _ in self.target.classes)
            watch = None if per_class else SLOMissWatch(self.target, 0)

            def make(n: int, seed: int) -> list[Session]:
                ss = self.make(n, seed)
                if watch is not None:
                    watch.most = sum(len(s.turns) for s in ss)
                return ss
            rate = round(load * cand.gpus, 9)
            dur = self.duration_s if whole else self.screen_duration_s
            ws = self.workload_seed
            res = simulate_rate(setup, make, rate, dur, self.target, self.ramp_s, seed=self.seed if ws is None else ws,
                                stop=watch, prime=self.prime() if self.prime else None,
                                session_seed=None if ws is None else session_seed(ws, rate))
            n = res["sessions"]
        cl = res["classes"]
        a = cl["all"]
        out = {"rate": rate, "slo_met": res["slo_met"], "ttft_p90_s": a["ttft_p90_s"], "tpot_s": a["tpot_s"],
               "tpot_p90_s": a["tpot_p90_s"], "attainment": a["attainment"], "attained": res["attained"],
               "success_rate": a["success_rate"], "headroom": self.target.headroom(cl),
               "stopped_at_s": res["sim"]["stopped_at_s"], "sessions": n, "events": res["sim"]["events"]}
        out.update({f"{c}_ttft_p90_s": cl[c]["ttft_p90_s"] for c, _ in self.target.classes if c != "all"})
        return out

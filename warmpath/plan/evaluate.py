"""One point of ``warmpath plan``: a candidate topology at one load, in the simulator (no torch).

A trace is replayed whole (or its first ``screen_requests``) at ``load``× its own arrival
rate (``bench/replay.py``); a workload runs ``load`` sessions/s per GPU for ``duration_s`` (or
``screen_duration_s``). Every run stops as soon as its SLO can no longer be met. To mirror a
benchmark of the real cluster (``benchmarks/plan_vs_real.py``) a workload point can also be
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
from warmpath.bench.replay import TracePoint, own_rate, replay
from warmpath.bench.workload import Session
from warmpath.plan.space import Candidate
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


def class_headroom(classes: dict, class_slo: dict) -> float | None:
    """The tightest class's TTFT p90 over its limit (``class_slo``: class -> seconds), over the
    classes that completed a request; 1 = at the limit."""
    vals = [classes[c]["ttft_p90_s"] / lim for c, lim in class_slo.items() if classes[c]["ttft_p90_s"] is not None]
    return max(vals) if vals else None


@functools.lru_cache(maxsize=None)
def _ppd_table(hw, model, tp: int):
    from warmpath.sim.repro import ppd_table_for   # the roofline's PPD table (what `calibrate` measures)

    return ppd_table_for(hw, model, tp)[0]


@dataclass
class SimEvaluator:
    """``base``: every setting but the topology and TP. ``trace`` or ``make`` (workload sessions).
    ``class_slo``: TTFT p90 limit per class (e.g. ``{"warm": 2, "cold": 20}``), met with ``slo``
    (give ``{}`` for the success share alone); no early stop then. ``prime``: sessions run first
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
            watch = SLOMissWatch(self.slo, sum(len(s.turns) for s in sessions))
            res = simulate_rate(setup, lambda n, s: sessions, load * self.own, 0.0, self.slo, seed=self.seed,
                                fixed_arrivals=True, stop=watch)
            rate, n = load * self.own, len(sessions)
        else:
            watch = None if self.class_slo else SLOMissWatch(self.slo, 0)

            def make(n: int, seed: int) -> list[Session]:
                ss = self.make(n, seed)
                if watch is not None:
                    watch.most = sum(len(s.turns) for s in ss)
                return ss
            rate = round(load * cand.gpus, 9)
            dur = self.duration_s if whole else self.screen_duration_s
            ws = self.workload_seed
            res = simulate_rate(setup, make, rate, dur, self.slo, self.ramp_s, seed=self.seed if ws is None else ws,
                                stop=watch, prime=self.prime() if self.prime else None,
                                session_seed=None if ws is None else session_seed(ws, rate))
            n = res["sessions"]
        cl = res["classes"]
        a, met, head = cl["all"], res["slo_met"], headroom(cl, self.slo)
        if self.class_slo:
            h = class_headroom(cl, self.class_slo)
            met = met and (h is None or h <= 1.0)
            head = h if head is None else max(h or 0.0, head)
        out = {"rate": rate, "slo_met": met, "ttft_p90_s": a["ttft_p90_s"], "tpot_s": a["tpot_s"],
               "success_rate": a["success_rate"], "headroom": head,
               "stopped_at_s": res["sim"]["stopped_at_s"], "sessions": n, "events": res["sim"]["events"]}
        if self.class_slo:
            out.update({f"{c}_ttft_p90_s": cl[c]["ttft_p90_s"] for c in self.class_slo})
        return out

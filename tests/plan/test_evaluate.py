"""``plan_eval``: a point held to a TTFT p90 per request class, primed and seeded as a real
benchmark, and PPD ``dynamic`` with or without the roofline's table (hand-worked on one
replica whose every step takes 0.1 s)."""

import pytest

from warmpath.launch.topology import Topology
from warmpath.slo import Target
from warmpath.plan.evaluate import SimEvaluator, with_classes
from warmpath.plan.space import Candidate
from warmpath.sim.run import simulate_rate

from tests.sim.test_simulator import one_turn, setup

ONE = Topology("one", "replica", {"replica": 1})


def _make(seen: list):
    """Every session the same 32-token prompt (seed 0); records the (n, seed) it was asked for."""
    def make(n: int, seed: int):
        seen.append((n, seed))
        return [one_turn(f"s{i}", 0.0, seed=0) for i in range(n)]
    return make


def test_class_headroom_is_the_tightest_class_that_completed():
    t = with_classes({}, {"warm": 2.0, "cold": 20.0})
    assert t == Target.parse("warm.ttft_p90=2,cold.ttft_p90=20")
    cl = {"warm": {"ttft_p90_s": 1.0}, "cold": {"ttft_p90_s": 30.0}}
    assert t.headroom(cl) == 1.5                                            # cold: 30 / 20
    cl["cold"]["ttft_p90_s"] = None                                         # no cold request completed
    assert t.headroom(cl) == 0.5
    assert with_classes({}, {"warm": 2.0}).headroom({"warm": {"ttft_p90_s": None}}) is None


def test_prime_runs_first_outside_the_statistics_and_sessions_take_their_own_seed():
    # 0.5 sessions/s for 4 s, arrivals of seed 7: 4 sessions (at 0.78, 1.11, 3.21, 3.37 s)
    seen: list = []
    primed = simulate_rate(setup(ONE), _make(seen), 0.5, 4.0, {}, seed=7, prime=[one_turn("p", 0.0, seed=0)],
                           session_seed=107)
    plain = simulate_rate(setup(ONE), _make(seen), 0.5, 4.0, {}, seed=7)
    assert seen == [(4, 107), (4, 7)]
    # primed: the prompt's first 16-token block is cached for all 4 (the last token is always computed);
    # the priming turn itself is not counted
    a = primed["classes"]
    assert (a["all"]["completed"], a["all"]["cached_tokens"], a["warm"]["completed"], a["cold"]["completed"]) == (
        4, 64, 4, 0)
    # not primed: the first is cold (one 0.1 s step), the other 3 find its block
    b = plain["classes"]
    assert (b["all"]["cached_tokens"], b["warm"]["completed"], b["cold"]["completed"]) == (48, 3, 1)
    assert b["cold"]["ttft_p90_s"] == pytest.approx(0.1)
    assert primed["duration_s"] == plain["duration_s"] == 4.0 and primed["sessions"] == 4


def test_a_point_meets_every_class_limit_or_misses():
    cand = Candidate("replica", (1,), (1,))
    seen: list = []
    ev = SimEvaluator(setup(ONE), {}, make=_make(seen), duration_s=4.0, class_slo={"warm": 2.0, "cold": 0.05},
                      workload_seed=7)
    p = ev(cand, 0.5, True)
    # sessions of seed 7 + int(0.5 * 1000); arrivals of seed 7 (4 of them); the cold one: 0.1 s > 0.05 s
    assert seen == [(4, 507)] and p["rate"] == 0.5
    assert (p["slo_met"], p["headroom"], p["cold_ttft_p90_s"]) == (False, pytest.approx(2.0), pytest.approx(0.1))
    primed = SimEvaluator(setup(ONE), {}, make=_make(seen), duration_s=4.0, class_slo={"warm": 2.0, "cold": 0.05},
                          workload_seed=7, prime=lambda: [one_turn("p", 0.0, seed=0)])
    p = primed(cand, 0.5, True)
    # primed: no cold request, the warm p90 within 2 s
    assert p["slo_met"] and p["cold_ttft_p90_s"] is None and p["headroom"] == p["warm_ttft_p90_s"] / 2.0
    # float noise is rounded away before the seed: 0.105 / 3 per GPU times 3 GPUs is 0.10499999999999998,
    # int(1000x) 104; rounded, rate 0.105 -> sessions of seed 7 + 105
    seen.clear()
    p = SimEvaluator(setup(ONE), {}, make=_make(seen), duration_s=4.0, class_slo={"warm": 2.0},
                     workload_seed=7)(Candidate("replica", (3,), (1,)), 0.105 / 3, True)
    assert 0.105 / 3 * 3 != 0.105 and p["rate"] == 0.105 and seen[0][1] == 7 + 105


def test_dynamic_ppd_with_or_without_the_roofline_table():
    cpd = Candidate("cpd", (1, 1, 1), (1, 1, 1), "dynamic")
    base = setup(ONE)
    with_table = SimEvaluator(base, {}, make=_make([])).setup(cpd)
    online = SimEvaluator(base, {}, make=_make([]), roofline_ppd=False).setup(cpd)
    assert with_table.ppd_table is not None and online.ppd_table is None
    assert online.topology.ppd == "dynamic" and online.topology.policy == "cpd"

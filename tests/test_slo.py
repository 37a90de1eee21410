"""``slo.py``: parsing, JSON round trip, per-request attainment, the run-level
check and goodput, on hand-worked records."""

import json

import pytest

from warmpath.bench.metrics import Record, summarize
from warmpath.slo import CLUSTER_TARGET, Bounds, Target, goodput


def rec(ttft, e2e, n, cls="warm", turn=1, ok=True, itls=()):
    return Record("s", turn, cls, ok, ttft, e2e, n, 10, 0, list(itls))


def test_the_old_syntax_and_the_per_class_one_parse():
    t = Target.parse("ttft_p90=2,tpot=0.1")
    assert t.classes == (("all", Bounds(ttft_p90=2.0, tpot=0.1)),) and (t.attain, t.min_success) == (0.9, 0.99)
    t = Target.parse("warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.05,attain=0.8,success=0.95")
    assert t.flat() == {"tpot_p90": 0.05, "cold.ttft_p90": 20.0, "warm.ttft_p90": 2.0}
    assert (t.attain, t.min_success) == (0.8, 0.95)
    assert Target.parse(None).empty and Target.parse("").flat() == {}


@pytest.mark.parametrize("bad", ["ttft_p90", "foo=1", "tpot=-1", "ttft_p90=x", "hot.ttft=1", "attain=0",
                                 "attain=1.5", "ttft=1,ttft=2", "warm.tpot=1,warm.tpot=1"])
def test_bad_specs_are_refused(bad):
    with pytest.raises(ValueError, match="--slo"):
        Target.parse(bad)


@pytest.mark.parametrize("spec", ["ttft_p90=2,tpot=0.1", "warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.05,attain=0.8",
                                  "turn2+.itl_p99=0.3,e2e=9,success=0.5"])
def test_json_and_spec_round_trips(spec):
    t = Target.parse(spec)
    assert Target.from_json(json.loads(json.dumps(t.to_json()))) == t
    assert Target.parse(t.spec()) == t and Target.of(t.flat() | {"attain": t.attain, "success": t.min_success}) == t
    assert Target.of(t) is t and Target.of(t.to_json()) == t


def test_per_request_bounds_per_class():
    t = Target.parse("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.1")
    # a cold request gets 20 s, a warm one 2 s; both the all-class TPOT bound
    assert t.request_bound(["all", "cold", "turn1"], "ttft") == 20.0
    assert t.request_bound(["all", "warm", "turn2+"], "ttft") == 2.0
    assert t.request_bound(["all", "warm", "turn1"], "tpot") == 0.1
    assert t.attains(rec(5.0, 5.5, 11, cls="cold"))          # TTFT 5 <= 20, TPOT 0.05 <= 0.1
    assert not t.attains(rec(5.0, 5.5, 11, cls="warm"))      # TTFT 5 > 2
    assert not t.attains(rec(1.0, 3.0, 11, cls="warm"))      # TPOT 0.2 > 0.1
    assert not t.attains(rec(None, None, 0, ok=False))
    # a median is no per-request bound at the 90% share; at a 50% share it is
    assert Target.parse("ttft_p50=1").attains(rec(3.0, 3.0, 1))
    assert not Target.parse("ttft_p50=1,attain=0.5").attains(rec(3.0, 3.0, 1))
    # ITL: the request's largest gap
    assert not Target.parse("itl=0.2").attains(rec(0.1, 0.5, 3, itls=[0.1, 0.3]))


def test_attainment_and_the_run_level_check():
    """10 warm requests, TPOT 0.1 s each except two at 0.3 s: 8 of 10 attain tpot=0.15."""
    rs = [rec(0.5, 0.5 + 0.1 * 10, 11) for _ in range(8)] + [rec(0.5, 0.5 + 0.3 * 10, 11) for _ in range(2)]
    s = summarize(rs, 10.0, "tpot=0.15")
    w = s["warm"]
    assert (w["attained"], w["attainment"]) == (8, 0.8) and s["cold"]["attainment"] is None
    assert w["tpot_p50_s"] == pytest.approx(0.1) and w["tpot_p90_s"] == pytest.approx(0.3)
    assert w["tpot_p99_s"] == pytest.approx(0.3) and w["goodput_rps"] == pytest.approx(0.8)
    assert not Target.parse("tpot=0.15").met(s)                       # 0.8 < 0.9
    assert Target.parse("tpot=0.15,attain=0.8").met(summarize(rs, 10.0, "tpot=0.15,attain=0.8"))
    # a quantile bound: TPOT p90 interpolates to 0.3 over 8 x 0.1 and 2 x 0.3 (p90 position 8.1)
    tq = Target.parse("tpot_p90=0.25,attain=0.5")
    assert tq.misses(summarize(rs, 10.0, tq)) == ["all tpot_p90 0.3 > 0.25"]
    assert not tq.met(summarize(rs, 10.0, tq)) and tq.attained(summarize(rs, 10.0, tq))


def test_cluster_target_checks_each_class_and_success():
    warm = [rec(1.0, 2.0, 2, cls="warm")] * 9 + [rec(3.0, 4.0, 2, cls="warm")]     # 90% within 2 s
    cold = [rec(15.0, 16.0, 2, cls="cold")] * 10
    s = summarize(warm + cold, 60.0, CLUSTER_TARGET)
    assert (s["warm"]["attainment"], s["cold"]["attainment"], s["all"]["attainment"]) == (0.9, 1.0, 0.95)
    assert s["warm"]["ttft_p90_s"] == pytest.approx(1.2) and CLUSTER_TARGET.met(s)
    # two warm misses: 80% < 90%, though the p90 (2.6 s) would say the same
    s = summarize(warm[:8] + [warm[-1]] * 2 + cold, 60.0, CLUSTER_TARGET)
    assert CLUSTER_TARGET.attainment_misses(s) == ["warm attainment 0.800 < 0.9"]
    # one failure in 21: success 95% < 99%
    s = summarize(warm + cold + [rec(None, None, 0, ok=False)], 60.0, CLUSTER_TARGET)
    assert not CLUSTER_TARGET.met(s) and CLUSTER_TARGET.misses(s)[0] == "success 0.952"
    assert CLUSTER_TARGET.headroom(summarize(warm + cold, 60.0, CLUSTER_TARGET)) == pytest.approx(15.0 / 20)


def test_goodput_is_the_highest_rate_attained_with_every_lower_one():
    runs = {0.1: {"attained": True, "achieved_rps": 0.3, "attainment": 1.0},
            0.2: {"attained": True, "achieved_rps": 0.55, "attainment": 0.95},
            0.4: {"attained": False, "achieved_rps": 0.7, "attainment": 0.6},
            0.8: {"attained": True, "achieved_rps": 0.9, "attainment": 0.91}}   # noise above a miss
    assert goodput(runs) == {"offered_rps": 0.2, "achieved_rps": 0.55, "attainment": 0.95}
    runs[0.1]["attained"] = False
    assert goodput(runs) == {"offered_rps": None, "achieved_rps": None, "attainment": None}

import pytest

from warmpath.bench.metrics import Record, meets, parse_slo, slo_met, summarize, ttft_from


def rec(ttft, e2e, n, turn=1, cls="cold", ok=True, itls=()):
    return Record("s", turn, cls, ok, ttft, e2e, n, 10, 0, list(itls))


def test_tpot_with_one_token_and_many():
    assert rec(0.5, 0.5, 1).tpot == 0.0
    assert rec(0.5, 1.5, 11).tpot == pytest.approx(0.1)
    assert rec(None, None, 0, ok=False).tpot is None


def test_summary_on_hand_made_timeline():
    rs = [rec(0.1, 1.1, 11, itls=[0.1] * 10), rec(0.3, 0.8, 6, turn=2, cls="warm", itls=[0.1] * 5),
          rec(2.5, 3.0, 2, itls=[0.5]), rec(None, None, 0, ok=False)]
    s = summarize(rs, duration_s=10.0, slo={"ttft": 1.0, "tpot": 0.2})
    a = s["all"]
    assert (a["completed"], a["failed"]) == (3, 1)
    assert a["ttft_p50_s"] == 0.3 and a["ttft_p90_s"] == pytest.approx(2.06)
    assert a["tpot_s"] == pytest.approx((0.1 + 0.1 + 0.5) / 3)
    assert a["itl_s"] == pytest.approx((0.1 * 15 + 0.5) / 16)
    assert a["throughput_tok_s"] == pytest.approx(1.9)
    assert a["goodput_rps"] == pytest.approx(0.2)  # the third misses ttft, the fourth failed
    assert s["warm"]["completed"] == 1 and s["turn2+"]["ttft_p50_s"] == 0.3
    assert s["cold"]["failed"] == 1 and s["turn1"]["completed"] == 2
    assert a["success_rate"] == 0.75
    assert a["client_wait_p90_s"] == 0.0 and a["reuse_from_overlap"] == 0


def test_ttft_from_names_the_timing():
    assert (ttft_from(None), ttft_from(4)) == ("arrival", "send")


def test_meets_and_slo_met():
    assert meets(rec(0.5, 1.0, 2, itls=[0.5]), {"ttft_p90": 1.0, "itl": 0.6})
    assert not meets(rec(0.5, 1.0, 2, itls=[0.7]), {"itl": 0.6})
    ok = summarize([rec(0.5, 1.0, 3)] * 10, 5.0, {})
    assert slo_met(ok, {"ttft_p90": 1.0})
    assert not slo_met(ok, {"ttft_p90": 0.4})
    some_fail = summarize([rec(0.5, 1.0, 3)] * 10 + [rec(None, None, 0, ok=False)], 5.0, {})
    assert not slo_met(some_fail, {"ttft_p90": 1.0})


@pytest.mark.parametrize("bad", ["ttft_p90", "foo=1", "tpot=-1", "ttft_p90=x"])
def test_parse_slo_errors(bad):
    with pytest.raises(ValueError):
        parse_slo(bad)


def test_parse_slo():
    assert parse_slo("ttft_p90=2.0,tpot=0.2").flat() == {"ttft_p90": 2.0, "tpot": 0.2}
    assert parse_slo(None).flat() == {} and parse_slo(None).empty

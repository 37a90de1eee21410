"""benchmarks/reliability/soak_report.py: the soak's drift per series, on hand-worked numbers."""

import pytest

from benchmarks.reliability.soak_report import (Drift, drift_of, drifts, fill_times, idle_fds, mean_in, note_for, table, verdict,
                                   windows, without_kv)

T = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]


def test_windows_follow_the_warm_up():
    assert windows(100, 0.2) == ((20, 40), (80, 100))
    assert windows(1800, 0.2) == ((360, 720), (1440, 1800))
    assert windows(100, 0.0) == ((0, 20), (80, 100))
    with pytest.raises(ValueError):
        windows(100, 0.7)                 # the early window would run into the late one


def test_drift_compares_the_late_mean_with_the_early_one():
    grows = list(zip(T, [50, 80, 100, 100, 110, 120, 120, 120, 100, 110, 120]))
    # warm-up [0, 20) left out; early t = 20, 30, 40: (100 + 100 + 110) / 3; late t = 80, 90, 100: 110
    assert mean_in(grows, 20, 40) == pytest.approx(310 / 3)
    d = drift_of(grows, (20, 40), (80, 100))
    assert d.early == pytest.approx(310 / 3) and d.late == 110
    assert d.drift == pytest.approx(110 / (310 / 3) - 1) == pytest.approx(2 / 31)   # +6.5%
    assert d.flagged
    flat = list(zip(T, [9, 9, 100, 100, 100, 7, 7, 7, 104, 104, 104]))
    assert drift_of(flat, (20, 40), (80, 100)) == Drift(100, 104, pytest.approx(0.04), False)
    shrinks = list(zip(T, [0, 0, 100, 100, 100, 0, 0, 0, 50, 50, 50]))
    assert drift_of(shrinks, (20, 40), (80, 100)).drift == -0.5      # shrinking is not flagged
    assert not drift_of(shrinks, (20, 40), (80, 100)).flagged


def test_from_zero_and_missing_windows():
    assert drift_of([(30, 0), (90, 0)], (20, 40), (80, 100)) == Drift(0, 0, 0.0, False)
    assert drift_of([(30, 0), (90, 2)], (20, 40), (80, 100)) == Drift(0, 2, None, True)   # from nothing
    assert drift_of([(30, 5)], (20, 40), (80, 100)) == Drift(5, None, None, False)      # no late sample


def test_bounded_series_carry_their_reason_and_only_unbounded_growth_fails():
    assert note_for("rss_mib/router") == "" and note_for("fds/worker decode-0") == ""
    assert "session-idle-s" in note_for("sessions")
    assert "capacity" in note_for("kv_blocks/decode-0/L2/cached")
    assert "load" in note_for("kv_blocks/decode-0/L1/in_use")
    up = list(zip(T, [1, 1, 10, 10, 10, 10, 10, 10, 20, 20, 20]))
    flat = list(zip(T, [5] * 11))
    d = drifts({"sessions": up, "rss_mib/router": up, "fds/router": flat, "load/router_in_flight": up}, 100, 0.2)
    assert list(d) == ["fds/router", "rss_mib/router", "sessions"]       # the load is not judged
    assert [k for k, x in d.items() if x.flagged] == ["rss_mib/router", "sessions"]
    v = verdict(d, {"lost": 0})
    assert v == {"flagged_unbounded": ["rss_mib/router"], "flagged_bounded_by_design": ["sessions"],
                 "fds_grown_at_idle": [], "lost": 0, "goal_met": False}
    assert verdict(drifts({"sessions": up, "fds/router": flat}, 100, 0.2), {"lost": 0})["goal_met"]
    assert not verdict(drifts({"fds/router": flat}, 100, 0.2), {"lost": 1})["goal_met"]
    lines = table(d).splitlines()
    assert lines[2].split() == ["rss_mib/router", "10.00", "20.00", "+100.0%", "GROWS"]
    assert lines[3].split() == ["sessions", "10.00", "20.00", "+100.0%", "grows", "(bounded)"]


def test_when_each_pool_filled():
    cached = list(zip(T, [0, 50, 80, 94, 95, 96, 90, 100, 100, 100, 100]))
    s = {"capacity/d/L1": [(t, 100) for t in T], "kv_blocks/d/L1/cached": cached,
         "capacity/d/L2": [(t, 10) for t in T], "kv_blocks/d/L2/cached": [(t, 3) for t in T],
         "capacity/p/L2": [(t, 0) for t in T]}       # no L2 at all: nothing to fill
    assert fill_times(s) == {"d/L1": 40, "d/L2": None}   # 95 of 100 first at t = 40
    assert "capacity/d/L1" not in drifts(s, 100, 0.2)


def test_worker_rss_is_judged_without_the_kv_pool_it_committed():
    # 2 MiB blocks; L1 holds 1, 3, then 2 blocks (its pages stay committed: peak 3), L2 0, 0, 4
    mib = 1 << 20
    s = {"rss_mib/worker w": [(0, 100), (10, 106), (20, 114)], "rss_mib/router": [(0, 50), (10, 50), (20, 50)],
         "capacity/w/L1": [(0, 8)] * 3, "capacity_bytes/w/L1": [(0, 16 * mib)] * 3,
         "capacity/w/L2": [(0, 8)] * 3, "capacity_bytes/w/L2": [(0, 16 * mib)] * 3,
         "kv_blocks/w/L1/cached": [(0, 1), (10, 2), (20, 2)], "kv_blocks/w/L1/in_use": [(0, 0), (10, 1), (20, 0)],
         "kv_blocks/w/L2/cached": [(0, 0), (10, 0), (20, 4)]}
    assert without_kv(s) == {"rss_minus_kv_mib/worker w": [(0, 98.0), (10, 100.0), (20, 100.0)]}
    assert note_for("rss_mib/worker w").startswith("includes the worker's KV pools")
    assert note_for("rss_minus_kv_mib/worker w") == ""


def test_router_descriptors_are_judged_at_idle():
    s = {"fds/router": [(0, 20), (10, 34), (20, 20)], "fds/worker w": [(0, 40), (10, 47), (20, 47)],
         "fds/x": [(0, 10), (20, 11)]}
    assert idle_fds(s) == {"fds/router": (20, 20, False)}
    assert idle_fds({"fds/router": [(0, 20), (20, 22)]}) == {"fds/router": (20, 22, True)}
    v = verdict({}, {"lost": 0}, idle_fds({"fds/router": [(0, 20), (20, 22)]}))
    assert v["fds_grown_at_idle"] == ["fds/router"] and not v["goal_met"]

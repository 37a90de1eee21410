"""Trace replay at a chosen load (bench/replay.py): hand-worked rescales, caps, points."""

from pathlib import Path

import pytest

from warmpath.bench.replay import (TracePoint, load_trace, own_rate, parse_floats, replay, rescale, sweep_fields,
                                   trace_points)
from warmpath.bench.workload import Session, Turn

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def trace(*starts):
    return [Session(f"r{i}", [Turn([1000 + i], 1)], start=t) for i, t in enumerate(starts)]


def test_own_rate_is_one_over_the_mean_gap():
    assert own_rate(trace(0, 1, 2, 4)) == 0.75            # 3 gaps over 4 s
    assert own_rate(trace(10, 11, 12, 14)) == 0.75        # where it starts does not matter
    with pytest.raises(ValueError, match="span no time"):
        own_rate(trace(0, 0, 0))


def test_twice_the_rate_halves_every_arrival():
    t = trace(0, 1, 2, 4)
    fast, left_out = rescale(t, 2.0)
    assert [s.start for s in fast] == [0.0, 0.5, 1.0, 2.0] and left_out == 0
    assert [s.start for s in t] == [0, 1, 2, 4]                       # the trace itself is unchanged
    assert [s.turns for s in fast] == [s.turns for s in t]
    # a trace recorded from t = 10 s starts at 0 at any speed
    assert [s.start for s in rescale(trace(10, 11, 12, 14), 0.5)[0]] == [0.0, 2.0, 4.0, 8.0]


def test_an_absolute_rate_picks_the_speed_that_gives_that_mean_rate():
    t = trace(0, 1, 2, 4)
    (p,) = trace_points(t, rates=[3.0])
    assert p == TracePoint(3.0, 4.0)
    sessions, _ = rescale(t, p.speed)
    assert [s.start for s in sessions] == [0.0, 0.25, 0.5, 1.0] and own_rate(sessions) == 3.0
    assert trace_points(t, [0.5, 1, 2, 4]) == [TracePoint(0.375, 0.5), TracePoint(0.75, 1), TracePoint(1.5, 2),
                                               TracePoint(3.0, 4)]
    assert trace_points(t) == [TracePoint(0.75, 1.0)]                  # neither: its own pace
    assert trace_points(trace(0, 0)) == [TracePoint(0.0, 1.0)]          # all at once: only as recorded
    with pytest.raises(ValueError, match="not both"):
        trace_points(t, [1.0], [1.0])
    with pytest.raises(ValueError, match="> 0"):
        trace_points(t, [0.0])
    with pytest.raises(ValueError, match="span no time"):
        trace_points(trace(0, 0), rates=[1.0])


def test_duration_caps_a_replay_and_says_so():
    said = []
    sessions, fields = replay(trace(0, 1, 2, 4), TracePoint(1.5, 2.0), 1.0, said.append)
    assert [s.start for s in sessions] == [0.0, 0.5]                   # 1.0 and 2.0 are not < 1 s
    assert fields == {"trace_speed": 2.0, "trace_requests": 2, "trace_left_out": 2}
    assert said == ["trace at 2x (1.5 req/s): --duration 1 s keeps 2 of 4 requests"]
    said.clear()
    sessions, fields = replay(trace(0, 1, 2, 4), TracePoint(1.5, 2.0), None, said.append)
    assert len(sessions) == 4 and fields["trace_left_out"] == 0 and said == []


def test_sweep_fields_report_the_speed_of_the_best_rate():
    t = trace(0, 1, 2, 4)
    runs = {0.75: {"trace_speed": 1.0}, 1.5: {"trace_speed": 2.0}}
    assert sweep_fields(t, runs, 1.5) == {"trace_requests": 4, "trace_own_rps": 0.75,
                                          "max_trace_speed_meeting_slo": 2.0}
    assert sweep_fields(t, runs, None)["max_trace_speed_meeting_slo"] is None


def test_load_trace_and_parse():
    ss = load_trace(TRACES / "mooncake_synthetic.jsonl", block=16, max_output=4)
    assert len(ss) == 3993 and ss[0].turns[0].max_tokens <= 4
    cs = load_trace(TRACES / "azure_code.csv", scale=0.01)
    assert len(cs) == 8819 and len(cs[0].turns[0].new_tokens) == 48
    with pytest.raises(ValueError, match="nope.jsonl"):
        load_trace(TRACES / "nope.jsonl")
    assert parse_floats("0.5,1,2", "--trace-speed") == [0.5, 1.0, 2.0] and parse_floats(None, "x") is None
    with pytest.raises(ValueError, match="--rates"):
        parse_floats("1,x", "--rates")

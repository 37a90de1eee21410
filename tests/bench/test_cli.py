"""``warmpath bench --trace`` end to end against an in-process fake target (no server):
the whole trace at each speed, fresh token ids per point, the duration cap, the timing label."""

import json

import pytest

import warmpath.bench.cli as bench_cli
from tests.bench.test_runner import FakeTarget
from tests.sim.test_sim_cli import small_trace
from warmpath.cli import main


@pytest.fixture
def target(monkeypatch):
    made = []

    def make(*args, **kw):
        made.append(FakeTarget(delay=0.02, cached=lambda sid, prompt: None))   # reports no cached tokens
        return made[-1]

    monkeypatch.setattr(bench_cli, "OpenAITarget", make)
    return made


def bench(tmp_path, *flags):
    out = tmp_path / "out"
    assert main(["bench", "--url", "http://127.0.0.1:9", "--trace", str(small_trace(tmp_path / "t.jsonl")),
                 "--trace-block", "16", "--no-retokenize", "--quiet", "--out", str(out), *flags]) == 0
    return json.loads((out / "summary.json").read_text())


def test_trace_replayed_whole_at_each_speed_with_fresh_prompts(tmp_path, target, capsys):
    s = bench(tmp_path, "--trace-speed", "20,40", "--slo", "ttft_p90=1")
    assert list(s["rates"]) == ["15.0", "30.0"] and s["ttft_from"] == "arrival"
    assert [(r["trace_speed"], r["trace_requests"], r["sessions"]) for r in s["runs"].values()] == [(20, 4, 4),
                                                                                                    (40, 4, 4)]
    assert (s["max_rate_meeting_slo"], s["max_trace_speed_meeting_slo"]) == (30.0, 40.0)
    (t,) = target
    first, second = [p for _, p in t.prompts[:4]], [p for _, p in t.prompts[4:]]
    assert sorted(map(len, first)) == sorted(map(len, second)) and not set(map(tuple, first)) & set(map(tuple, second))
    # no cached tokens reported: classes from the overlap (rows 1 and 3 extend rows 0 and 1:
    # 64 of 128 and 128 of 192 tokens, warm and turn 2+), the same at the second point
    for classes in s["rates"].values():
        assert (classes["warm"]["completed"], classes["turn2+"]["completed"]) == (2, 2)
        assert classes["all"]["reuse_from_overlap"] == 4
    assert "(20x trace)" in capsys.readouterr().out


def test_duration_caps_the_replay_and_max_concurrency_times_from_send(tmp_path, target, capsys):
    s = bench(tmp_path, "--rates", "7.5", "--duration", "0.3", "--max-concurrency", "1")
    run = s["runs"]["7.5"]
    assert (run["trace_speed"], run["trace_requests"], run["trace_left_out"]) == (10.0, 3, 1)
    assert s["ttft_from"] == run["ttft_from"] == "send" and target[0].max_in_flight == 1
    assert "--duration 0.3 s keeps 3 of 4 requests" in capsys.readouterr().err


def test_trace_flag_errors(tmp_path, target):
    tr = str(small_trace(tmp_path / "t.jsonl"))
    base = ["bench", "--url", "http://127.0.0.1:9", "--no-retokenize"]
    assert main([*base, "--trace", tr, "--ramp", "5"]) == 2
    assert main([*base, "--workload", "ppd-grid", "--trace-speed", "2"]) == 2
    assert main([*base, "--trace", tr, "--concurrency", "2", "--max-concurrency", "1"]) == 2

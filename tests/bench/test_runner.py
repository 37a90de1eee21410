"""The session runner against an in-process fake target (timings under our control)."""

import asyncio

from warmpath.bench.runner import Answer, BenchTarget, run
from warmpath.bench.sweep import run_rate
from warmpath.bench.workload import Session, Turn


class FakeTarget(BenchTarget):
    def __init__(self, delay=0.05, fail_on=()):
        self.delay, self.fail_on = delay, set(fail_on)
        self.in_flight = self.max_in_flight = 0
        self.prompts = []

    async def complete(self, prompt, max_tokens, session_id):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.prompts.append((session_id, list(prompt)))
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        if session_id in self.fail_on:
            return Answer(False, error="boom")
        return Answer(True, 0.01, self.delay, "x", max_tokens, len(prompt), 0, [0.001] * (max_tokens - 1))


def sessions(n, turns=2):
    return [Session(f"s{i}", [Turn([i, t], 3, "cold" if t == 0 else "warm") for t in range(turns)],
                    prefix=[99]) for i in range(n)]


def test_history_grows_with_filler_answers_and_failures_end_a_session():
    t = FakeTarget(fail_on={"s1"})
    records, wall = asyncio.run(run(t, sessions(2), encode=None))
    by = {}
    for sid, p in t.prompts:
        by.setdefault(sid, []).append(p)
    assert by["s0"][0] == [99, 0, 0]
    assert by["s0"][1][:3] == [99, 0, 0] and len(by["s0"][1]) == 3 + 3 + 2  # + 3 filler + new turn
    assert by["s0"][1][-2:] == [0, 1]
    assert len(by["s1"]) == 1  # failed on turn 1: no turn 2
    assert sorted((r.sid, r.turn, r.ok) for r in records) == [("s0", 1, True), ("s0", 2, True), ("s1", 1, False)]


def test_encoder_is_used_for_answers():
    t = FakeTarget()
    asyncio.run(run(t, sessions(1), encode=lambda text: [7] * len(text)))
    assert t.prompts[1][1] == [99, 0, 0, 7, 0, 1]


def test_closed_loop_concurrency_and_stop():
    t = FakeTarget(delay=0.05)
    res = asyncio.run(run_rate(t, lambda n, seed: sessions(n, turns=1), None, 0.5, {}, concurrency=3, quiet=True))
    assert t.max_in_flight == 3
    assert 0.5 <= res["duration_s"] < 1.0
    assert 20 <= res["classes"]["all"]["completed"] <= 33


def test_timed_arrivals():
    t = FakeTarget(delay=0.01)
    res = asyncio.run(run_rate(t, lambda n, seed: sessions(n, turns=1), 20.0, 1.0, {"ttft": 1.0}, quiet=True))
    assert res["sessions"] == res["classes"]["all"]["completed"] > 5
    assert res["slo_met"] and res["tier_hit_ratio"] == {"L1": None, "L2": None, "L3": None}

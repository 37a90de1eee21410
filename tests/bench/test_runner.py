"""The session runner against an in-process fake target (timings under our control)."""

import asyncio

from warmpath.bench.runner import Answer, BenchTarget, run
from warmpath.bench.sweep import run_rate
from warmpath.bench.workload import Session, Turn


class FakeTarget(BenchTarget):
    """Answers after ``delay``; reports ``cached(session, prompt)`` cached tokens (None: none reported)."""

    def __init__(self, delay=0.05, fail_on=(), cached=lambda sid, prompt: 0):
        self.delay, self.fail_on, self.cached = delay, set(fail_on), cached
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
        return Answer(True, 0.01, self.delay, "x", max_tokens, len(prompt), self.cached(session_id, prompt),
                      [0.001] * (max_tokens - 1))


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


def test_classes_come_from_the_reported_cached_tokens_not_the_label():
    # s0 labelled cold/warm gets nothing cached; s1 gets all of every prompt
    t = FakeTarget(delay=0.01, cached=lambda sid, prompt: len(prompt) if sid == "s1" else 0)
    records, _ = asyncio.run(run(t, sessions(2), encode=None))
    got = sorted((r.sid, r.turn, r.cls, r.reuse) for r in records)
    assert got == [("s0", 1, "cold", "cached"), ("s0", 2, "cold", "cached"),
                   ("s1", 1, "warm", "cached"), ("s1", 2, "warm", "cached")]


def test_without_a_report_the_class_is_the_overlap_with_earlier_prompts():
    """Three one-turn requests, sent in order (blocks of 16): 20 tokens (cold); the same first
    16 + 4 others (16/20 reused: warm); r1's 20 + 12 more (extends r1: turn 2; its second
    block is new, so 16 of 32 reused, exactly half: warm)."""
    base = list(range(1000, 1016))
    trace = [Session("r0", [Turn(base + [1, 2, 3, 4], 1)], start=0.0),
             Session("r1", [Turn(base + [5, 6, 7, 8], 1)], start=0.05),
             Session("r2", [Turn(base + [5, 6, 7, 8] + list(range(12)), 1)], start=0.1)]
    t = FakeTarget(delay=0.01, cached=lambda sid, prompt: None)
    records, _ = asyncio.run(run(t, trace))
    got = sorted((r.sid, r.turn, r.cls, r.reuse, r.cached_tokens) for r in records)
    assert got == [("r0", 1, "cold", "overlap", 0), ("r1", 1, "warm", "overlap", 0),
                   ("r2", 2, "warm", "overlap", 0)]


def test_client_side_cap_delays_sends_and_ttft_is_timed_from_the_send():
    """Three requests at t=0, 0.1 s each, at most one in flight: sent at 0, 0.1, 0.2; each TTFT
    is the target's own (from its send), the wait is recorded beside it."""
    t = FakeTarget(delay=0.1)
    res = asyncio.run(run_rate(t, None, None, None, {}, fixed=[Session(f"s{i}", [Turn([i], 2)]) for i in range(3)],
                               quiet=True, max_concurrency=1))
    assert t.max_in_flight == 1 and res["ttft_from"] == "send"
    a = res["classes"]["all"]
    assert a["completed"] == 3 and a["ttft_p90_s"] == 0.01
    # waits 0, 0.1, 0.2 (p90 = 0.18), plus the event loop's slack on a busy machine
    assert 0.17 <= a["client_wait_p90_s"] < 0.5
    records, _ = asyncio.run(run(FakeTarget(delay=0.1), [Session(f"s{i}", [Turn([i], 2)]) for i in range(3)],
                                 max_concurrency=2))
    w = sorted(r.client_wait_s for r in records)
    assert w[1] < 0.05 and 0.09 <= w[2] < 0.4          # two sent at once, the third after the first ends
    uncapped = run_rate(FakeTarget(0.01), None, None, None, {}, fixed=[Session("a", [Turn([1], 2)])], quiet=True)
    assert asyncio.run(uncapped)["ttft_from"] == "arrival"

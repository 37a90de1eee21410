"""Processor sharing of simulated steps on a few cores, worked out by hand."""

import heapq
import itertools

import pytest

from warmpath.sim.cpu import SharedCores


class Loop:
    """A minimal event queue like the simulation's."""

    def __init__(self) -> None:
        self.heap, self.tie, self.now, self.ends = [], itertools.count(), 0.0, {}

    def at(self, t, fn, *args) -> None:
        heapq.heappush(self.heap, (t, next(self.tie), fn, args))

    def run(self) -> None:
        while self.heap:
            self.now, _, fn, args = heapq.heappop(self.heap)
            fn(*args)

    def done(self, key):
        return lambda: self.ends.__setitem__(key, self.now)


def test_a_step_that_started_alone_slows_when_another_starts():
    loop = Loop()
    cpu = SharedCores(1, loop.at)
    cpu.run(0.0, "a", [(1.0, 1.0)], loop.done("a"))
    loop.at(0.5, lambda: cpu.run(0.5, "b", [(1.0, 1.0)], loop.done("b")))
    loop.run()
    # a: 0.5 s alone, then its last 0.5 s at half speed; b: 0.5 s at half speed, then alone
    assert loop.ends == {"a": pytest.approx(1.5), "b": pytest.approx(2.0)}
    assert cpu.busy_core_s == pytest.approx(2.0)


def test_phases_demand_their_own_cores():
    loop = Loop()
    cpu = SharedCores(1, loop.at)
    # a transfer with the store's process beside the worker (1.5 cores), then compute
    cpu.run(0.0, "a", [(0.5, 1.5), (0.5, 1.0)], loop.done("a"))
    loop.run()
    assert loop.ends == {"a": pytest.approx(0.5 * 1.5 + 0.5)}


def test_contention_slows_cores_running_together():
    loop = Loop()
    cpu = SharedCores(2, loop.at, contention=0.1)
    cpu.run(0.0, "a", [(1.0, 1.0)], loop.done("a"))
    cpu.run(0.0, "b", [(1.0, 1.0)], loop.done("b"))
    loop.at(0.0, lambda: cpu.run(0.0, "c", [(0.0, 1.0)], loop.done("c")))   # nothing to do: ends at once
    loop.run()
    assert loop.ends == {"a": pytest.approx(1.1), "b": pytest.approx(1.1), "c": 0.0}


def test_three_on_two_cores_share_them_and_a_key_runs_one_job():
    loop = Loop()
    cpu = SharedCores(2, loop.at)
    for k in "abc":
        cpu.run(0.0, k, [(1.0, 1.0)], loop.done(k))
    with pytest.raises(RuntimeError, match="already running"):
        cpu.run(0.0, "a", [(1.0, 1.0)], loop.done("a"))
    loop.run()
    assert loop.ends == {k: pytest.approx(1.5) for k in "abc"}
    with pytest.raises(ValueError, match="cores"):
        SharedCores(0, loop.at)

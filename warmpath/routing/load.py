"""Load the router itself has sent each worker and not yet seen finish (pure).

Heartbeats report a worker's queue every few seconds; between them the router adds what it
dispatched, so two requests arriving together do not both pick the same idle worker.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from warmpath.routing.views import WorkerView


@dataclass
class WorkerLoad:
    prefill_tokens: int = 0      # prompt tokens sent for computing, not answered yet
    running: int = 0             # requests decoding there
    pending: int = 0             # requests prefilling there, or whose decode will go there
    prefilling: int = 0          # requests computing their prompt there (sent, no first token yet)
    context_tokens: int = 0      # their contexts (prompt + half the answer each)

    def plus(self, other: WorkerLoad) -> WorkerLoad:
        """The two loads together (this router's and another's on one worker)."""
        return WorkerLoad(self.prefill_tokens + other.prefill_tokens, self.running + other.running,
                          self.pending + other.pending, self.prefilling + other.prefilling,
                          self.context_tokens + other.context_tokens)


@dataclass
class LoadBook:
    """Router-tracked load per worker."""

    load: dict[str, WorkerLoad] = field(default_factory=dict)
    # decode worker -> request key -> (monotonic time its first token is predicted back, the
    # seconds of KV load its handoff will cost that worker)
    bound: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    def of(self, worker: str) -> WorkerLoad:
        return self.load.get(worker, WorkerLoad())

    def add(self, worker: str, prefill_tokens: int = 0, running: int = 0, pending: int = 0,
            context: int = 0) -> None:
        x = self.load.setdefault(worker, WorkerLoad())
        x.prefill_tokens = max(0, x.prefill_tokens + prefill_tokens)
        x.running = max(0, x.running + running)
        x.pending = max(0, x.pending + pending)
        x.context_tokens = max(0, x.context_tokens + context) if x.running else 0

    def start_computing(self, worker: str, tokens: int) -> Callable[[], None]:
        """``tokens`` prompt tokens queued on ``worker`` (one request prefilling there, when
        any) until the returned release is called; calling it again does nothing (a
        non-streamed answer is released at its predicted first token and again at its end)."""
        one = 1 if tokens > 0 else 0
        self.add(worker, tokens)
        self.load[worker].prefilling += one
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self.add(worker, -tokens)
                self.load[worker].prefilling -= one
        return release

    @contextmanager
    def computing(self, worker: str, tokens: int):
        """:meth:`start_computing` for the duration of the block."""
        release = self.start_computing(worker, tokens)
        try:
            yield
        finally:
            release()

    @contextmanager
    def holding(self, *workers: str):
        """One request pending on each of ``workers`` for the duration of the block (its
        prefill there, or its prefill elsewhere before its decode there): a drain waits."""
        for w in workers:
            self.add(w, pending=1)
        try:
            yield
        finally:
            for w in workers:
                self.add(w, pending=-1)

    def expect(self, worker: str, key: str, at: float, load_s: float) -> None:
        """A handoff bound for ``worker`` (its prompt computing elsewhere): its first token
        predicted back at ``at``, then ``load_s`` seconds of KV load there (maybe none: its decode
        joins the batch there all the same)."""
        self.bound.setdefault(worker, {})[key] = (at, load_s)

    def landed(self, worker: str, key: str) -> None:
        """The handoff ``key`` reached ``worker`` (or failed): no longer bound there."""
        mine = self.bound.get(worker, {})
        mine.pop(key, None)
        if not mine:
            self.bound.pop(worker, None)

    @contextmanager
    def bound_for(self, worker: str, key: str, at: float, load_s: float):
        """:meth:`expect` for the duration of the block (the prefill), then :meth:`landed`."""
        self.expect(worker, key, at, load_s)
        try:
            yield
        finally:
            self.landed(worker, key)

    def incoming(self, worker: str, now: float) -> tuple[tuple[float, float], ...]:
        """The handoffs bound for ``worker``: (seconds from ``now`` until each lands, at least 0;
        its load seconds), soonest first."""
        return tuple(sorted((max(0.0, at - now), s) for at, s in list(self.bound.get(worker, {}).values())))

    def in_flight(self, worker: str) -> int:
        """Requests the router has on ``worker`` and has not seen end (what a drain waits for)."""
        x = self.of(worker)
        return x.running + x.pending

    def views(self, views: list[WorkerView], now: float,
              others: Callable[[str], WorkerLoad] | None = None) -> list[WorkerView]:
        """``views`` with the queue, running counts, contexts and handoffs bound there this
        router knows of (``now``: the monotonic clock of :meth:`bound_for`'s times), plus
        ``others(worker)``: what the other routers of the fleet have there (``routing/peers.py``)."""
        out = []
        for v in views:
            x = self.of(v.worker_id)
            if others is not None:
                x = x.plus(others(v.worker_id))
            out.append(replace(v, queued_prefill_tokens=x.prefill_tokens, running=x.running,
                               prefilling=x.prefilling, running_tokens=x.context_tokens,
                               incoming=self.incoming(v.worker_id, now)))
        return out

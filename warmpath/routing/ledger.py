"""One request's books around the route decision, kept the same way by the router and the
simulator (pure: no I/O, no clock of its own — callers pass ``now``).

A request's life: **admit** (a slot, a place in its class's queue, or 429) → **hold** (the
goodput policy may hold it; decided again knowing how long) → **dispatch** (its session's
turn counted) → **end** (the latency model learns from its measured TTFT and TPOT, the
session learns where its KV now lives, the slot goes to the next waiter and the fleet's limit
may be re-sized) — or **abandon** (the client left: the queue place or the slot is freed).

``router/flow.py`` drives it from HTTP handlers, ``sim/simulation.py`` from simulated events;
what each does with the keys it returns (wake an ``asyncio.Event``, plan a dispatch) is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace

from warmpath.routing.admission import Admission
from warmpath.routing.route import RouteDecider
from warmpath.routing.sessions import SessionState, SessionTable
from warmpath.routing.tenants import DEFAULT_TENANT, request_cost
from warmpath.routing.views import Decision, RequestView, WorkerView


@dataclass(frozen=True)
class Ended:
    """What an answered request's end taught the latency model: relative errors of its TTFT
    and TPOT predictions (``None``: not predicted or not measured), and the waiters that
    now have a slot."""

    ttft_err: float | None
    tpot_err: float | None
    woken: list


class RequestLedger:
    """The decider, admission and session table, and the bookkeeping of every request's life."""

    def __init__(self, decider: RouteDecider, admission: Admission, sessions: SessionTable,
                 fleet: Callable[[], list[WorkerView]]) -> None:
        """``fleet()``: the workers new requests may go to, with what each can hold (the
        admission limit is sized from them)."""
        self.decider, self.admission, self.sessions, self.fleet = decider, admission, sessions, fleet

    def admit(self, key: Hashable, rv: RequestView, d: Decision, now: float = 0.0) -> str:
        """``run`` (a slot now), ``queued`` (waits in the fair queue, by its priority band and
        its tenant's share: wake it on a key :meth:`release` returns, then decide again),
        ``rejected`` (the queues are full: 429) or ``limited`` (its tenant is past its tokens per
        second: 429 after ``admission.retry_after_s``). Its tenant is charged its path's cost:
        the prompt tokens computed, those loaded, the answer's budget."""
        cost = request_cost(rv.num_tokens - d.cached_tokens, d.cached_tokens, rv.max_tokens)
        return self.admission.offer(key, d.cls, rv.tenant, rv.priority, cost, rv.num_tokens + rv.max_tokens, now)

    @staticmethod
    def held(rv: RequestView, held_since: float, now: float) -> RequestView:
        """A held request, to be decided again: its view knows how long it has been held."""
        return replace(rv, waited_s=now - held_since)

    def dispatched(self, sess: SessionState | None) -> None:
        """The request leaves the router for its workers: its session's turn counts."""
        if sess is not None:
            sess.turns += 1

    def ended(self, d: Decision, prompt_tokens: int, completion_tokens: int, ttft_s: float | None,
              tpot_s: float | None, sess: SessionState | None, tenant: str = DEFAULT_TENANT) -> Ended:
        """An answered request ended: the latency model and the PPD feedback learn from its
        measured TTFT (from admission) and TPOT, its session remembers where its KV is (the
        decode worker) and how long its history is, and its slot goes on."""
        ttft_err, tpot_err = self.decider.observe_outcome(d, ttft_s, tpot_s)
        if sess is not None:
            sess.turn_ended(d.decode, prompt_tokens, completion_tokens)
        return Ended(ttft_err, tpot_err, self.release(prompt_tokens + completion_tokens, tenant))

    def answered(self, worker: str, usage: dict | None, view, computed_here: bool) -> bool:
        """The answering worker's own report of it (``usage["warmpath"]``: its timings, its
        L3 loads): that worker's lines learn (its prefill line only when ``computed_here``,
        no handoff). Returns whether anything was learnt; a malformed report is ignored."""
        return self.decider.observe_answer(worker, usage, view, computed_here)

    def abandoned_waiting(self, key: Hashable) -> bool:
        """A queued request's client left: ``True`` when it was still queued (nothing else to
        free); ``False`` when it had just been given a slot (then :meth:`release` it)."""
        return self.admission.cancel(key)

    def release(self, kv_tokens: int | None = None, tenant: str = DEFAULT_TENANT) -> list:
        """A request's slot is free (``kv_tokens``: the KV it held at its end, prompt + answer,
        when it ran to its end: the fleet's limit may be re-sized from it; ``tenant``: whose).
        Returns the keys of the waiters that now have a slot, in the order they go."""
        refit = bool(kv_tokens) and self.admission.observe(kv_tokens)
        woken = [k for k in (self.admission.release(tenant),) if k is not None]
        if refit:
            woken += self.fit()
        return woken

    def fit(self) -> list:
        """Size the admission limit to the fleet now (a worker joined, left or changed role);
        returns the waiters a larger limit lets in."""
        return [k for k in self.admission.fit(self.fleet()) if k is not None]

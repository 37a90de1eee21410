"""Admission control: bounded requests in flight, bounded per-tier wait queues (pure).

The in-flight limit is, by default, **sized to the fleet** (:func:`fleet_limit`): the sum
over the registered workers of the sequences each can hold at once — its scheduler's
sequence limit, or fewer when its L1 KV has room for fewer requests of the size the router
has been seeing. It follows workers joining, leaving and changing role; the per-tier wait
queues scale with it. A fixed ``max_in_flight`` (``--max-in-flight``) overrides the rule.
Several routers share the limit (``routing/peers.py``): each admits ``ceil(limit / routers)``.
Who waits goes in the fair queue (``routing/fair_queue.py``: priority bands, tenants' fair
share, warm before cold); a tenant past its tokens-per-second limit is refused at once.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Iterable

from warmpath.routing.fair_queue import FairQueue, Waiter
from warmpath.routing.tenants import DEFAULT_TENANT, TenantConfig, TokenBucket, VirtualCounters
from warmpath.routing.views import WorkerView

# the wait queues beside a limit L: cold 4/3 L, warm 8/3 L (32 / 64 at the old fixed 24),
# never below those floors
QUEUE_SHARE = {"cold": (4 / 3, 32), "warm": (8 / 3, 64)}
UNKNOWN_WORKER_SEQS = 64     # a worker that reports no sequence limit (the engine's default)
SIZE_WINDOW = 256            # requests in the running mean of a request's KV tokens


@dataclass(frozen=True)
class AdmissionConfig:
    """``max_in_flight`` running at once (``None``: sized to the fleet, :func:`fleet_limit`);
    beyond it, up to ``queue_limits[tier]`` wait (``None``: scaled with the limit, see
    ``QUEUE_SHARE``); beyond that the request is rejected (HTTP 429, ``retry_after_s``)."""

    max_in_flight: int | None = None
    queue_limits: dict | None = None
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.max_in_flight is not None and self.max_in_flight <= 0:
            raise ValueError(f"max_in_flight must be > 0, got {self.max_in_flight}")
        if self.queue_limits is not None and any(v < 0 for v in self.queue_limits.values()):
            raise ValueError("queue limits must be >= 0")

    @classmethod
    def from_flags(cls, max_in_flight: int | None, cold_queue: int | None, warm_queue: int | None,
                   ) -> AdmissionConfig:
        """From ``--max-in-flight`` / ``--cold-queue`` / ``--warm-queue`` (``None``: derived);
        a queue flag given alone fixes that queue, the other one still scales."""
        fixed = {t: v for t, v in (("cold", cold_queue), ("warm", warm_queue)) if v is not None}
        return cls(max_in_flight, fixed or None)

    def to_argv(self) -> list[str]:
        """The router flags that give this config (what the launcher passes on)."""
        out = [] if self.max_in_flight is None else ["--max-in-flight", str(self.max_in_flight)]
        for t, v in sorted((self.queue_limits or {}).items()):
            out += [f"--{t}-queue", str(v)]
        return out


@dataclass(frozen=True)
class FleetLimit:
    """The in-flight limit in force and why: ``slots`` per worker, the request size used."""

    limit: int
    source: str                       # "fixed" (--max-in-flight) or "fleet"
    slots: dict[str, int] = field(default_factory=dict)
    request_tokens: float | None = None
    routers: int = 1                  # routers sharing the fleet's limit (``limit`` is this one's share)
    fleet: int | None = None          # the whole fleet's limit when shared

    def shared(self, routers: int) -> FleetLimit:
        """This router's share when ``routers`` share the limit: ``ceil(limit / routers)``."""
        if routers <= 1:
            return self
        return replace(self, limit=max(1, math.ceil(self.limit / routers)), routers=routers, fleet=self.limit)

    @property
    def reason(self) -> str:
        whole = self.fleet if self.fleet is not None else self.limit
        share = f"; this router admits 1/{self.routers} of it: {self.limit}" if self.routers > 1 else ""
        if self.source == "fixed":
            return f"fixed by --max-in-flight {whole}{share}"
        if not self.slots:
            return "no worker registered: 1 until one does"
        size = (f"KV room at {self.request_tokens:.0f} tokens per request" if self.request_tokens
                else "no request size seen yet")
        per = ", ".join(f"{w} {n}" for w, n in sorted(self.slots.items()))
        return f"sum of what each worker can hold (sequence limit, {size}): {per}{share}"

    def to_json(self) -> dict:
        return {"limit": self.limit, "source": self.source, "reason": self.reason,
                "slots": dict(self.slots), "request_tokens": self.request_tokens,
                "routers": self.routers, "fleet_limit": self.fleet if self.fleet is not None else self.limit}


def worker_slots(w: WorkerView, request_tokens: float | None) -> int:
    """Requests ``w`` can hold at once: its sequence limit, or what its L1 KV has room for at
    ``request_tokens`` (prompt + answer) each, whichever is fewer; at least 1."""
    seqs = w.max_seqs if w.max_seqs is not None else UNKNOWN_WORKER_SEQS
    if w.kv_tokens is not None and request_tokens:
        seqs = min(seqs, int(w.kv_tokens // request_tokens))
    return max(1, seqs)


def fleet_limit(workers: Iterable[WorkerView], request_tokens: float | None) -> FleetLimit:
    """The one rule for the derived limit (router and simulator): the sum of
    :func:`worker_slots` over every registered worker, whatever its role — a request holds a
    prefill worker's KV while it is prefilled there and a decode worker's after; 1 when the
    fleet is empty."""
    slots = {w.worker_id: worker_slots(w, request_tokens) for w in workers}
    return FleetLimit(max(1, sum(slots.values())), "fleet", slots, request_tokens)


@dataclass
class Admission:
    """FIFO per tier; warm waiters are released before cold ones so a cold flood cannot
    starve warm traffic. Call :meth:`offer`, then :meth:`release` when a request ends, and
    :meth:`fit` when the fleet changes (it may release waiters)."""

    cfg: AdmissionConfig = field(default_factory=AdmissionConfig)
    tenants: TenantConfig = field(default_factory=TenantConfig)
    in_flight: int = 0
    queue: FairQueue = field(init=False)
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    retry_after_s: float = 0.0      # the last "limited" verdict's wait (a tenant's tokens per second)
    limited: int = 0                # requests refused for a tenant's limit
    tenant_in_flight: Counter = field(default_factory=Counter)   # requests running per tenant
    rejected: int = 0
    peak_waiting: int = 0           # the most requests that waited at once (does the limit bind?)
    sizes: deque = field(default_factory=lambda: deque(maxlen=SIZE_WINDOW))
    current: FleetLimit = field(default_factory=lambda: FleetLimit(1, "fleet"))
    routers: int = 1                # routers sharing the limit (set by the peer loop, then fit)

    def __post_init__(self) -> None:
        if self.cfg.max_in_flight is not None:
            self.current = FleetLimit(self.cfg.max_in_flight, "fixed")
        self.queue = FairQueue(VirtualCounters(dict(self.tenants.weights)))

    @property
    def limit(self) -> int:
        return self.current.limit

    def queue_limit(self, tier: str) -> int:
        if self.cfg.queue_limits is not None and tier in self.cfg.queue_limits:
            return self.cfg.queue_limits[tier]
        share, floor = QUEUE_SHARE.get(tier, (0, 0))
        return max(floor, round(share * self.limit))

    def offer(self, key: object, tier: str, tenant: str = DEFAULT_TENANT, priority: int = 0,
              cost: float = 1.0, tokens: int = 0, now: float = 0.0) -> str:
        """``"run"``, ``"queued"``, ``"rejected"`` (the queues are full) or ``"limited"``
        (``tenant`` has its most requests in flight or waiting, or is past its tokens per
        second: ``retry_after_s`` says for how long). A
        request is charged ``cost`` to its tenant as it starts (VTC); ``tokens``: its prompt +
        answer budget, what the tenant's tokens-per-second limit counts."""
        lim = self.tenants.limit_of(tenant)
        holds = self.tenant_in_flight[tenant] + self.queue.by_tenant[tenant]
        if lim.max_in_flight is not None and holds >= lim.max_in_flight:
            self.limited += 1
            self.retry_after_s = float(self.cfg.retry_after_s)
            return "limited"
        rate = lim.tokens_per_s
        if rate is not None:
            wait = self.buckets.setdefault(tenant, TokenBucket(rate)).take(tokens, now)
            if wait > 0:
                self.limited += 1
                self.retry_after_s = wait
                return "limited"
        if (self.in_flight < self.limit and not self.waiting()) or (
                not self.queue.by_tenant[tenant] and self.tenant_in_flight[tenant] < self.fair_share(tenant)):
            self.in_flight += 1          # NOTE: the second case may pass the limit (see fair_share)
            self.tenant_in_flight[tenant] += 1
            self.queue.vtc.charge(tenant, cost)
            return "run"
        if self.queue.by_tier[tier] >= self.queue_limit(tier):
            self.rejected += 1
            return "rejected"
        self.queue.push(Waiter(key, tier, tenant, priority, cost))
        self.peak_waiting = max(self.peak_waiting, self.waiting())
        return "queued"

    def waiting(self) -> int:
        return len(self.queue)

    def fair_share(self, tenant: str) -> float:
        """``tenant``'s share of the limit among the tenants with requests in flight or waiting
        (itself included), by weight. A tenant under its share with nothing waiting starts at
        once, even past the limit: a flood that holds every slot does not make a light tenant
        wait for the flood's requests to end (the workers then order it first:
        :meth:`worker_priority`). The limit is passed by at most the under-share tenants'
        shares together, less than the limit; one tenant alone: never."""
        active = self._active() | {tenant}
        w = self.tenants.weight_of
        return self.limit * w(tenant) / sum(w(t) for t in active)

    def worker_priority(self, tenant: str, priority: int) -> int:
        """The priority a worker's scheduler orders and preempts this request by, as it leaves
        the router: its band first (``2 × priority``), then whether its tenant still has
        requests waiting here while another tenant is served too (+1: a backlogged tenant's
        requests go after, and are preempted before, those of a tenant within its share — the
        fair share reaches the workers). One tenant alone: always its band's, as before tenants."""
        backlogged = self.queue.by_tenant[tenant] > 0 and bool(self._active() - {tenant})
        return 2 * priority + (1 if backlogged else 0)

    def _active(self) -> set[str]:
        """The tenants with requests in flight or waiting."""
        return {t for t, n in (*self.tenant_in_flight.items(), *self.queue.by_tenant.items()) if n}

    def cancel(self, key: object) -> bool:
        """Remove a waiter that gave up (e.g. its client disconnected)."""
        return self.queue.cancel(key)

    def observe(self, request_tokens: int) -> bool:
        """A request ended holding ``request_tokens`` of KV (prompt + answer); ``True`` when
        the mean request size moved by more than 1% since the limit was fitted (refit then)."""
        self.sizes.append(request_tokens)
        if self.cfg.max_in_flight is not None:
            return False
        fitted, mean = self.current.request_tokens, self.request_tokens()
        return not fitted or abs(mean - fitted) > 0.01 * fitted

    def request_tokens(self) -> float | None:
        return sum(self.sizes) / len(self.sizes) if self.sizes else None

    def fit(self, workers: Iterable[WorkerView]) -> list:
        """Size the limit to ``workers`` (unless fixed); returns the waiters it lets start."""
        whole = (fleet_limit(workers, self.request_tokens()) if self.cfg.max_in_flight is None
                 else FleetLimit(self.cfg.max_in_flight, "fixed"))
        self.current = whole.shared(self.routers)
        out = []
        while self.in_flight < self.limit and (nxt := self._next()) is not None:
            out.append(nxt)
        return out

    def release(self, tenant: str = DEFAULT_TENANT) -> object | None:
        """A running request of ``tenant`` ended; returns the waiter that may start now, if any."""
        self.in_flight -= 1
        self.tenant_in_flight[tenant] = max(0, self.tenant_in_flight[tenant] - 1)
        if self.in_flight >= self.limit:    # the limit shrank meanwhile: nobody starts
            return None
        return self._next()

    def _next(self) -> object | None:
        """The next waiter's key, now running (``None``: nobody waits)."""
        w = self.queue.pop()
        if w is None:
            return None
        self.in_flight += 1
        self.tenant_in_flight[w.tenant] += 1
        return w.key

    def to_json(self) -> dict:
        """What ``/v1/cluster`` and the dashboard show: the limit in force and why, queues."""
        return {"in_flight": self.in_flight, "waiting": self.waiting(), "rejected": self.rejected,
                "peak_waiting": self.peak_waiting,
                **{k: v for k, v in self.current.to_json().items() if k != "limit"},
                "max_in_flight": self.limit,
                "queue_limits": {t: self.queue_limit(t) for t in sorted({*QUEUE_SHARE, *self.queue.by_tier})},
                "limited": self.limited,
                "tenants": {t: {"in_flight": self.tenant_in_flight[t], "waiting": self.queue.by_tenant[t],
                                "counter": round(c, 1)}
                            for t, c in sorted(self.queue.vtc.counters.items())[:64]}}

"""Tenants and priorities: whom a request is for, how urgent it is, and each tenant's fair
share of the fleet's work (pure).

* **Identity.** A tenant comes from the API key the request carried (``--api-key
  KEY=TENANT``; a key without a name is tenant ``default``), or, on a router without API
  keys, from the ``X-Tenant-Id`` header. A priority comes from the request's ``priority``
  field or the ``X-Priority`` header, vLLM's polarity: smaller is more urgent, 0 by default.
* **Fair share** (VTC, Sheng et al., "Fairness in Serving Large Language Models", OSDI
  2024): each tenant has a virtual counter of the weighted work it was given; among the
  tenants waiting in the most urgent band, the one with the least is served next. A tenant
  that starts waiting again is lifted to the least counter of those already waiting (or to
  the highest counter of all, when none wait), so idle time banks no credit. A request is
  charged by its path's cost (``request_cost``): the prompt tokens it computes, the KV it
  loads, the tokens it decodes — not its prompt length.
* **Limits** per tenant: requests in flight, and tokens per second (a token bucket over its
  requests' prompt + answer budget); past one, the request is refused (429, ``Retry-After``).

NOTE: no torch, no I/O; ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

DEFAULT_TENANT = "default"
MIN_PRIORITY, MAX_PRIORITY = -(2 ** 15), 2 ** 15 - 1
# prompt-token equivalents of a loaded token and of a decoded one: VTC's weights (an output
# token costs as much as two input tokens) and a load that moves bytes without computing them
LOADED_WEIGHT, DECODE_WEIGHT = 0.1, 2.0


def request_cost(computed: int, loaded: int, decode: int) -> float:
    """A request's work in prompt-token equivalents: tokens it computes, tokens whose KV it
    loads (from L2 / L3), tokens it decodes."""
    return computed + LOADED_WEIGHT * loaded + DECODE_WEIGHT * decode


@dataclass(frozen=True)
class TenantLimit:
    """A tenant's limits (``None``: none): requests in flight, tokens per second."""

    max_in_flight: int | None = None
    tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {self.max_in_flight}")
        if self.tokens_per_s is not None and not self.tokens_per_s > 0:
            raise ValueError(f"tokens_s must be > 0, got {self.tokens_per_s}")

    @classmethod
    def parse(cls, spec: str) -> tuple[str, TenantLimit]:
        """``TENANT:in_flight=N,tokens_s=R`` (``*``: every tenant without its own)."""
        tenant, sep, rest = spec.partition(":")
        if not sep or not tenant or not rest:
            raise ValueError(f"--tenant-limit: expected TENANT:in_flight=N,tokens_s=R, got {spec!r}")
        got: dict = {}
        for part in rest.split(","):
            k, eq, v = part.partition("=")
            if not eq or k not in ("in_flight", "tokens_s"):
                raise ValueError(f"--tenant-limit {spec!r}: unknown limit {k!r} (in_flight, tokens_s)")
            try:
                got[k] = int(v) if k == "in_flight" else float(v)
            except ValueError:
                raise ValueError(f"--tenant-limit {spec!r}: {k} must be a number, got {v!r}") from None
        return tenant, cls(got.get("in_flight"), got.get("tokens_s"))


@dataclass(frozen=True)
class TenantConfig:
    """API key → tenant, limits per tenant (``"*"``: the default), VTC weights (default 1)."""

    keys: dict[str, str] = field(default_factory=dict)
    limits: dict[str, TenantLimit] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    def limit_of(self, tenant: str) -> TenantLimit:
        return self.limits.get(tenant) or self.limits.get("*") or TenantLimit()

    def weight_of(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)


def split_keys(flags: Iterable[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``--api-key`` values (``KEY`` or ``KEY=TENANT``) → the keys, and key → tenant."""
    keys, tenants = [], {}
    for f in flags:
        key, _, tenant = f.partition("=")
        keys.append(key)
        tenants[key] = tenant or DEFAULT_TENANT
    return tuple(keys), tenants


def priority_of(field_value: int | None, header: str | None) -> int:
    """The request's ``priority`` field, else its ``X-Priority`` header, else 0; ``ValueError``
    when the header is not an integer or either is out of range."""
    p = field_value
    if p is None and header is not None:
        try:
            p = int(header)
        except ValueError:
            raise ValueError(f"X-Priority must be an integer, got {header!r}") from None
    p = 0 if p is None else p
    if not MIN_PRIORITY <= p <= MAX_PRIORITY:
        raise ValueError(f"priority must be in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {p}")
    return p


@dataclass
class VirtualCounters:
    """VTC's counters: per tenant, the weighted work it was given (see the module docstring)."""

    weights: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)

    def charge(self, tenant: str, cost: float) -> None:
        """``tenant`` was given ``cost`` of work (negative: a refund, when it used less)."""
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / self.weights.get(tenant, 1.0)

    def lift(self, tenant: str, waiting: Iterable[str]) -> None:
        """``tenant`` starts waiting beside ``waiting`` (the others waiting now): it banks no
        credit from the time it did not wait."""
        others = [self.counters.get(t, 0.0) for t in waiting if t != tenant]
        floor = min(others) if others else max(self.counters.values(), default=0.0)
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)

    def pick(self, waiting: Iterable[str]) -> str:
        """The waiting tenant served next: the least counter (ties: the name)."""
        return min(waiting, key=lambda t: (self.counters.get(t, 0.0), t))


@dataclass
class TokenBucket:
    """``rate`` tokens per second, at most one second's worth banked (or one request's)."""

    rate: float
    level: float = math.nan
    at: float = 0.0

    def take(self, tokens: int, now: float) -> float:
        """Take ``tokens`` now: 0.0 if there were enough (taken), else the seconds until
        there will be (nothing taken)."""
        cap = max(self.rate, float(tokens))
        self.level = cap if math.isnan(self.level) else min(cap, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level >= tokens:
            self.level -= tokens
            return 0.0
        return (tokens - self.level) / self.rate

"""The router's wait queue: priority bands, a fair share between tenants within a band,
warm before cold within a tenant (pure).

Who goes next when a slot frees: the most urgent band (smallest priority) that has waiters;
in it, the tenant with the least virtual counter (VTC, ``routing/tenants.py``); of that
tenant's waiters, the oldest warm one, else the oldest cold one (a cold flood cannot starve
warm traffic), else any other tier's oldest. One tenant at one priority — every request
before tenants existed — is the old order exactly: warm first, FIFO within a tier.

NOTE: no torch, no I/O.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from warmpath.routing.tenants import VirtualCounters

TIER_ORDER = ("warm", "cold")


@dataclass(frozen=True)
class Waiter:
    key: Hashable
    tier: str
    tenant: str
    priority: int
    cost: float


@dataclass
class FairQueue:
    """Waiters by band → tenant → tier; ``vtc`` is charged as each one is let go."""

    vtc: VirtualCounters = field(default_factory=VirtualCounters)
    bands: dict[int, dict[str, dict[str, deque]]] = field(default_factory=dict)
    by_tier: Counter = field(default_factory=Counter)
    by_tenant: Counter = field(default_factory=Counter)

    def __len__(self) -> int:
        return sum(self.by_tier.values())

    def push(self, w: Waiter) -> None:
        """``w`` waits (its tenant lifted if it starts waiting now: no banked credit)."""
        if not self.by_tenant[w.tenant]:
            self.vtc.lift(w.tenant, [t for t, n in self.by_tenant.items() if n])
        band = self.bands.setdefault(w.priority, {})
        band.setdefault(w.tenant, {}).setdefault(w.tier, deque()).append(w)
        self.by_tier[w.tier] += 1
        self.by_tenant[w.tenant] += 1

    def pop(self) -> Waiter | None:
        """The next waiter (see the module docstring), charged to its tenant; ``None`` if none."""
        if not self.bands:
            return None
        prio = min(self.bands)
        band = self.bands[prio]
        tenant = self.vtc.pick(band)
        tiers = band[tenant]
        tier = next(t for t in (*TIER_ORDER, *sorted(set(tiers) - set(TIER_ORDER))) if tiers.get(t))
        w = tiers[tier].popleft()
        self._forget(prio, tenant, tier)
        self.vtc.charge(w.tenant, w.cost)
        return w

    def cancel(self, key: Hashable) -> bool:
        """Remove the waiter ``key`` (its client left); ``False`` if it was not waiting."""
        for prio, band in self.bands.items():
            for tenant, tiers in band.items():
                for tier, q in tiers.items():
                    for w in q:
                        if w.key == key:
                            q.remove(w)
                            self._forget(prio, tenant, tier)
                            return True
        return False

    def _forget(self, prio: int, tenant: str, tier: str) -> None:
        self.by_tier[tier] -= 1
        self.by_tenant[tenant] -= 1
        band = self.bands[prio]
        if not band[tenant][tier]:
            del band[tenant][tier]
            if not band[tenant]:
                del band[tenant]
                if not band:
                    del self.bands[prio]

"""The router's global KV index, fed by workers' KV events, with a TTL fallback.

Exact mode: per worker, the set of block hashes it holds in L1/L2 (from ``BlockStored`` /
``BlockRemoved`` events), plus one cluster-wide set for L3. When a worker's events stop
(no batch for ``stale_after_s`` while it still heartbeats), the router switches that worker
to approximate mode: it assumes a worker holds what the router last sent it, for ``ttl_s``.

NOTE: no torch, no I/O; ``now`` is passed in so the simulator can drive time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.router.views import PrefixHit


@dataclass
class GlobalKVIndex:
    stale_after_s: float = 30.0
    ttl_s: float = 120.0
    max_approx_blocks: int = 1 << 20          # per worker; the oldest routed hints go first
    local: dict[str, dict[bytes, set[str]]] = field(default_factory=lambda: defaultdict(dict))
    l3: set[bytes] = field(default_factory=set)
    approx: dict[str, dict[bytes, float]] = field(default_factory=lambda: defaultdict(dict))
    last_event: dict[str, float] = field(default_factory=dict)

    def apply(self, worker: str, events: list, now: float) -> None:
        """Fold one batch of a worker's events into the index."""
        self.last_event[worker] = now
        held = self.local[worker]
        for e in events:
            if isinstance(e, BlockStored):
                for h in e.block_hashes:
                    if e.medium == "L3":
                        self.l3.add(h)
                    else:
                        held.setdefault(h, set()).add(e.medium)
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    if e.medium == "L3":
                        self.l3.discard(h)
                    elif h in held:
                        held[h].discard(e.medium)
                        if not held[h]:
                            del held[h]
            elif isinstance(e, AllBlocksCleared):
                held.clear()

    def note_routed(self, worker: str, hashes: tuple[bytes, ...], now: float) -> None:
        """The router sent these blocks to ``worker`` (used while its events are stale)."""
        d = self.approx[worker]
        for h in hashes:
            d.pop(h, None)                     # re-inserted last: dict order is LRU order
            d[h] = now + self.ttl_s
        while len(d) > self.max_approx_blocks:
            del d[next(iter(d))]
        # NOTE: the oldest hints come first and, the clock moving forward, expire first:
        # drop those past their TTL (lookup ignores them) so the dict does not keep every
        # block ever routed until the cap.
        while d:
            first = next(iter(d))
            if d[first] >= now:
                break
            del d[first]

    def sizes(self) -> dict[str, int]:
        """Block hashes held per set: ``local`` (every worker's L1/L2), ``l3``, ``approx``."""
        return {"local": sum(len(d) for d in self.local.values()), "l3": len(self.l3),
                "approx": sum(len(d) for d in self.approx.values())}

    def drop_worker(self, worker: str) -> None:
        """Forget a dead worker's entries."""
        self.local.pop(worker, None)
        self.approx.pop(worker, None)
        self.last_event.pop(worker, None)

    def is_stale(self, worker: str, now: float) -> bool:
        last = self.last_event.get(worker)
        return last is None or now - last > self.stale_after_s

    def lookup(self, worker: str, hashes: tuple[bytes, ...], now: float) -> PrefixHit:
        """Leading blocks ``worker`` holds locally, then how many more are in L3."""
        held = self.local.get(worker, {})
        approx = self.approx.get(worker, {}) if self.is_stale(worker, now) else {}
        n = 0
        for h in hashes:
            if h in held or approx.get(h, float("-inf")) >= now:   # any clock, negative times too
                n += 1
            else:
                break
        m = 0
        for h in hashes[n:]:
            if h not in self.l3:
                break
            m += 1
        return PrefixHit(n, m)

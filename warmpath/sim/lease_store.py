"""The simulated L3 evicted as Mooncake's master evicts (pure): in lease order (an option of the
CPU profile, ``warmpath sim --l3-eviction lease``; the default stays LRU, ``store.py``).

Mooncake (``master_service.cpp``, the defaults of the ``mooncake_master`` a cluster starts):
every read of a block — a get, and also an existence check (``BatchExistKey``) — leases it
for ``lease_s`` (``--default_kv_lease_ttl``, 10 s); a leased block cannot be evicted. A block
written and never read has a lease that ended at the clock's epoch, older than any other.
A background thread evicts while the store holds more than ``high_watermark`` of its
capacity (``--eviction_high_watermark_ratio``, 0.9), or after a put was refused:
``max(eviction_ratio, used − high_watermark + eviction_ratio)`` of its objects
(``--eviction_ratio``, 0.05), those whose lease ended first — blocks never read first, in no
time order (here: by hash), then the least recently read. A P→D handoff waiting for its
decode worker, or an answer's blocks waiting for the next turn, are such never-read blocks:
under pressure they go before a repository context read a minute ago.

Measured against the real runs (``docs/benchmarks/sim_accuracy.md``, near saturation): with it
the decode worker of the traced run recomputes what the real one did (22.7K vs 26.3K prompt
tokens), but below saturation the simulated cluster tips where the real one did not — so it
is not the default.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from warmpath.sim.store import SimStore


@dataclass
class LeaseStore(SimStore):
    """:class:`SimStore` with Mooncake's eviction (module docstring); ``blocks`` maps each
    hash to the end of its lease (``-inf``: never read), in the order stored."""

    high_watermark: float = 0.9
    lease_s: float = 10.0
    _need_eviction: bool = False     # a put was refused: the master evicts even below the watermark

    def count_prefix(self, hashes: list[bytes], now: float | None = None) -> int:
        """How many of ``hashes`` are stored, from the first on; at ``now`` every one of them
        stored is leased (an existence check leases what it finds, as a get does)."""
        n = next((i for i, h in enumerate(hashes) if h not in self.blocks), len(hashes))
        if now is not None:
            for h in hashes:
                if h in self.blocks:
                    self.blocks[h] = max(self.blocks[h], now + self.lease_s)
        return n

    def evict(self, now: float) -> list[bytes]:
        """The master's eviction at ``now``; returns the evicted hashes."""
        used = len(self.blocks) / self.capacity_blocks if self.capacity_blocks > 0 else 0.0
        if not self.blocks or not (used > self.high_watermark or self._need_eviction):
            return []
        self._need_eviction = False
        share = max(self.eviction_ratio, used - self.high_watermark + self.eviction_ratio)
        free = ((t, h) for h, t in self.blocks.items() if t <= now)   # leased blocks stay
        gone = [h for _, h in heapq.nsmallest(math.ceil(share * len(self.blocks)), free)]
        for h in gone:
            del self.blocks[h]
        self.evicted += len(gone)
        return gone

    def put(self, hashes: list[bytes], now: float = 0.0) -> tuple[list[bytes], list[bytes]]:
        """The master's eviction since the last put, then store the blocks that fit (never
        read) and refuse the rest; blocks already stored stay as they are (``EXISTS``).
        Returns (newly stored, evicted) hashes."""
        gone = self.evict(now)
        new = []
        for h in hashes:
            if h in self.blocks:
                continue
            if len(self.blocks) < self.capacity_blocks:
                self.blocks[h] = -math.inf
                new.append(h)
            else:
                self.refused += 1
                self._need_eviction = True
        return new, [g for g in gone if g not in self.blocks]   # evicted, then stored again by this put

"""The simulated L3 evicted as Mooncake's master evicts (pure): in lease order (an option of the
CPU profile, ``warmpath sim --l3-eviction lease``; the default stays LRU, ``store.py``).

Mooncake (``master_service.cpp``, the defaults of the ``mooncake_master`` a cluster starts):
every read of a block — a get, and also an existence check (``BatchExistKey``) — leases it
for ``lease_s`` (``--default_kv_lease_ttl``, 10 s); a leased block cannot be evicted. A block
written and never read has a lease that ended at the clock's epoch, older than any other.
A background thread evicts while the store holds more than ``high_watermark`` of its
capacity (``--eviction_high_watermark_ratio``, 0.9), or after a put was refused:
``max(eviction_ratio, used − high_watermark + eviction_ratio)`` of its objects
(``--eviction_ratio``, 0.05), shard by shard (:meth:`LeaseStore.evict`) — with a thousand
shards and a few thousand blocks, nearly any block not leased, whoever read it a minute ago:
not LRU. A P→D handoff waiting for its decode worker is such a block; the decode worker
recomputes what it lost.

Measured (``docs/benchmarks/sim_accuracy.md``, near saturation): on the traced real run the
decode worker recomputed 26.3K prompt tokens, the simulated one 6.0K with the LRU store and
32.2K with this one; below saturation (0.1 / 0.15 sessions/s, runs no calibration saw) it
brings the TPOT error from 14.8 / 30.6% to 7.9 / 3.7% (median of three runs each).
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from dataclasses import dataclass, field

from warmpath.sim.store import SimStore


@dataclass
class LeaseStore(SimStore):
    """:class:`SimStore` with Mooncake's eviction (module docstring); ``blocks`` maps each
    hash to the end of its lease (``-inf``: never read), in the order stored."""

    high_watermark: float = 0.9
    lease_s: float = 10.0
    shards: int = 1024               # the master's metadata shards (kNumShards); a block's: crc32 of its hash
    _need_eviction: bool = False     # a put was refused: the master evicts even below the watermark
    _rng: random.Random = field(default_factory=lambda: random.Random(0))   # the first shard of each pass

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
        """The master's eviction at ``now`` (``BatchEvict``); returns the evicted hashes.

        The target share of objects and a lower bound (half of it, or the excess over the
        watermark); leased blocks never go. First pass, shard by shard (``shards`` of them by
        key hash, from a random one): while the objects counted so far times the target exceed
        those evicted, a shard gives up its oldest leases, those no later than the one that
        fills its share — with a shard or two per object, nearly any block not leased, not the
        oldest of the store. Second pass, only when the first fell short of the lower bound: the
        oldest leases of the rest, store-wide."""
        used = len(self.blocks) / self.capacity_blocks if self.capacity_blocks > 0 else 0.0
        if not self.blocks or not (used > self.high_watermark or self._need_eviction):
            return []
        self._need_eviction = False
        target = max(self.eviction_ratio, used - self.high_watermark + self.eviction_ratio)
        lower = max(target * 0.5, used - self.high_watermark)
        groups: dict[int, list[bytes]] = {}
        for h in self.blocks:
            groups.setdefault(zlib.crc32(h) % self.shards, []).append(h)
        first = self._rng.randrange(self.shards)
        order = [(first + i) % self.shards for i in range(self.shards)]
        counted, gone, rest = 0, [], []
        for k in order:
            mine = groups.get(k, [])
            counted += len(mine)
            ideal = math.ceil(counted * target) - len(gone)
            free = [h for h in mine if self.blocks[h] <= now]
            if ideal <= 0 or not free:
                rest += free
                continue
            cut = sorted(self.blocks[h] for h in free)[min(ideal, len(free)) - 1]
            gone += [h for h in free if self.blocks[h] <= cut]
            rest += [h for h in free if self.blocks[h] > cut]
        more = min(math.ceil(counted * lower) - len(gone), len(rest))
        if more > 0:
            gone += [h for _, h in heapq.nsmallest(more, ((self.blocks[h], h) for h in rest))]
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

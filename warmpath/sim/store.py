"""The simulated distributed store (L3) and the bandwidth it shares (pure).

L3 is one cluster-wide LRU set of block hashes with a capacity in blocks, full as Mooncake's
is: a put that does not fit is refused (``NO_SPACE``: not stored, a future miss — whoever
needs those blocks recomputes them), and the master evicts in the background, not for the
put: when a put finds the store at ``high_watermark`` of its capacity or above, the master
has evicted the ``eviction_ratio`` least recently used share of the capacity since the last
put (0.95 and 0.05). Mooncake's own master is not LRU: it evicts shard by shard, nearly any
block not read in the last 10 s (``lease_store.py``: an option, not the default — see its docstring). Transfers to and
from it share the store's aggregate bandwidth: a transfer starting while ``k`` others are
in flight gets ``min(worker NIC, store bandwidth / (k + 1))`` for its whole length (a
deterministic approximation of processor sharing).
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class SharedLink:
    """Aggregate bandwidth shared by concurrent transfers."""

    bytes_s: float
    latency_s: float = 2e-4
    ends: list[float] = field(default_factory=list)   # sorted end times of transfers in flight
    bytes_moved: float = 0.0
    busy_s: float = 0.0

    def transfer(self, now: float, nbytes: float, nic_bytes_s: float) -> float:
        """Start a transfer at ``now``; returns its duration."""
        if nbytes <= 0:
            return 0.0
        del self.ends[:bisect.bisect_right(self.ends, now)]
        rate = min(nic_bytes_s, self.bytes_s / (len(self.ends) + 1))
        dur = self.latency_s + nbytes / rate
        bisect.insort(self.ends, now + dur)
        self.bytes_moved += nbytes
        self.busy_s += dur
        return dur


@dataclass
class SimStore:
    """Cluster-wide L3: LRU block set that refuses puts when full (module docstring);
    ``refused`` counts the blocks it turned away."""

    capacity_blocks: int
    link: SharedLink
    high_watermark: float = 0.95
    eviction_ratio: float = 0.05
    blocks: OrderedDict = field(default_factory=OrderedDict)
    evicted: int = 0
    refused: int = 0

    def count_prefix(self, hashes: list[bytes], now: float | None = None) -> int:
        """How many of ``hashes`` are stored, from the first on (each found becomes the most
        recently used; ``now`` is for stores that lease instead, :class:`~warmpath.sim.lease_store.LeaseStore`)."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            n += 1
        return n

    def put(self, hashes: list[bytes], now: float = 0.0) -> tuple[list[bytes], list[bytes]]:
        """The master's eviction since the last put if the store is at its watermark, then
        store the blocks that fit and refuse the rest; returns (newly stored, evicted) hashes."""
        gone = []
        if self.capacity_blocks > 0 and len(self.blocks) >= self.high_watermark * self.capacity_blocks:
            for _ in range(min(len(self.blocks), max(1, math.ceil(self.eviction_ratio * self.capacity_blocks)))):
                gone.append(self.blocks.popitem(last=False)[0])
        new = []
        for h in hashes:
            if h in self.blocks:
                self.blocks.move_to_end(h)
            elif len(self.blocks) < self.capacity_blocks:
                self.blocks[h] = None
                new.append(h)
            else:
                self.refused += 1
        gone = [g for g in gone if g not in self.blocks]   # evicted, then stored again by this put
        self.evicted += len(gone)
        return new, gone

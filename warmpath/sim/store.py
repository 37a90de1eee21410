"""The simulated distributed store (L3) and the bandwidth it shares (pure).

L3 is one cluster-wide LRU set of block hashes with a capacity in blocks. Transfers to and
from it share the store's aggregate bandwidth: a transfer starting while ``k`` others are
in flight gets ``min(worker NIC, store bandwidth / (k + 1))`` for its whole length (a
deterministic approximation of processor sharing).
"""

from __future__ import annotations

import bisect
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
    """Cluster-wide L3: LRU block set; ``on_evict`` is told which hashes fell out."""

    capacity_blocks: int
    link: SharedLink
    blocks: OrderedDict = field(default_factory=OrderedDict)
    evicted: int = 0

    def count_prefix(self, hashes: list[bytes]) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            n += 1
        return n

    def put(self, hashes: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """Store blocks; returns (newly stored, evicted) hashes."""
        new, gone = [], []
        for h in hashes:
            if h in self.blocks:
                self.blocks.move_to_end(h)
                continue
            if self.capacity_blocks <= 0:
                break
            while len(self.blocks) >= self.capacity_blocks:
                gone.append(self.blocks.popitem(last=False)[0])
            self.blocks[h] = None
            new.append(h)
        gone = [g for g in gone if g not in self.blocks]   # evicted, then stored again by this put
        self.evicted += len(gone)
        return new, gone

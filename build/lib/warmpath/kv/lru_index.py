"""A fixed-capacity LRU map from block hash to slot (the L2 bookkeeping).

NOTE: no torch; the simulator uses it to model host-DRAM tiers.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from warmpath.kv.hashing import BlockHash


@dataclass
class LRUSlotIndex:
    """``capacity`` slots; ``insert`` evicts the least recently used entry when full.

    Every slot is either free or holds exactly one hash.
    """

    capacity: int
    _map: "OrderedDict[BlockHash, int]" = field(init=False, default_factory=OrderedDict)
    _free: list[int] = field(init=False)
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {self.capacity}")
        self._free = list(range(self.capacity - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, h: BlockHash) -> bool:
        return h in self._map

    def count_prefix(self, hashes: list[BlockHash]) -> int:
        """How many leading ``hashes`` are held (no LRU update)."""
        n = 0
        for h in hashes:
            if h not in self._map:
                break
            n += 1
        return n

    def get(self, h: BlockHash, touch: bool = True) -> int | None:
        """Slot of ``h`` (marking it most recently used), or ``None``."""
        slot = self._map.get(h)
        if slot is None:
            self.misses += 1
            return None
        self.hits += 1
        if touch:
            self._map.move_to_end(h)
        return slot

    def insert(self, h: BlockHash) -> tuple[int, BlockHash | None] | None:
        """Reserve a slot for ``h``; returns ``(slot, evicted_hash)`` or ``None`` if
        ``h`` is already present or the capacity is 0."""
        if h in self._map or self.capacity == 0:
            if h in self._map:
                self._map.move_to_end(h)
            return None
        evicted = None
        if self._free:
            slot = self._free.pop()
        else:
            evicted, slot = self._map.popitem(last=False)
            self.evictions += 1
        self._map[h] = slot
        return slot, evicted

    def oldest(self) -> tuple[BlockHash, int] | None:
        """``(hash, slot)`` the next insert would evict when full, else ``None``."""
        if self._free or not self._map:
            return None
        h = next(iter(self._map))
        return h, self._map[h]

    def remove(self, h: BlockHash) -> bool:
        slot = self._map.pop(h, None)
        if slot is None:
            return False
        self._free.append(slot)
        return True

    def clear(self) -> list[BlockHash]:
        gone = list(self._map)
        self._map.clear()
        self._free = list(range(self.capacity - 1, -1, -1))
        return gone

    def check_integrity(self) -> None:
        slots = list(self._map.values())
        assert len(set(slots)) == len(slots), "two hashes share a slot"
        assert not set(slots) & set(self._free), "a used slot is also free"
        assert len(slots) + len(self._free) == self.capacity

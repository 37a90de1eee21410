"""The simulator's byte mover under the production :class:`~warmpath.engine.tier_rules.TierRules`
(pure, no torch): L2 is the real :class:`LRUSlotIndex`, L3 the shared :class:`SimStore`, and a
move costs modelled time instead of copying bytes.
"""

from __future__ import annotations

from warmpath.engine.sequence import Sequence
from warmpath.engine.tier_seams import LoadResult, TierMover
from warmpath.kv.block_pool import KVBlock
from warmpath.kv.lru_index import LRUSlotIndex
from warmpath.sim.store import SimStore


class SimTierMover(TierMover):
    """Models one worker's L2 and its link to the store.

    Load time accumulates in :attr:`load_s` (added to the step that needs it); blocks written
    to the store accumulate in :attr:`put_blocks` (one write at the end of the step).
    ``block_bytes`` is a block's payload (what L2 holds, what the cost model weighs);
    ``l3_block_bytes`` what the store holds and moves per block (payload + header; default:
    the payload). ``overlap``: a started load (``start_load``) lands its modelled seconds
    after it began instead of lengthening a step; the simulation wakes the worker then
    (:meth:`next_landing`). NOTE: an overlapped load takes no CPU from the worker's steps
    here (the real one verifies and copies its blocks on a loader thread).
    """

    def __init__(self, l2_blocks: int, store: SimStore | None, block_bytes: int,
                 dram_bytes_s: float, nic_bytes_s: float, l3_block_bytes: int | None = None,
                 overlap: bool = False) -> None:
        self.l2 = LRUSlotIndex(l2_blocks)
        self.store, self.block_bytes = store, block_bytes
        self.l3_block_bytes = l3_block_bytes or block_bytes
        self.dram_bytes_s, self.nic_bytes_s = dram_bytes_s, nic_bytes_s
        self.now = 0.0
        self.load_s = 0.0
        self.put_blocks = 0
        self._removed: list[bytes] = []
        self.overlap = overlap
        self._landings: list[float] = []   # when each started load lands

    @property
    def l2_capacity(self) -> int:
        return self.l2.capacity

    @property
    def has_l3(self) -> bool:
        return self.store is not None

    def count_l2(self, hashes: list[bytes]) -> int:
        return self.l2.count_prefix(hashes)

    def count_l3(self, hashes: list[bytes]) -> int:
        return self.store.count_prefix(hashes, self.now)   # Mooncake's existence check leases what it finds

    def in_l2(self, h: bytes) -> bool:
        return h in self.l2

    def l2_victim(self) -> bytes | None:
        old = self.l2.oldest()
        return None if old is None else old[0]

    def demote(self, blk: KVBlock) -> bytes | None:
        got = self.l2.insert(blk.block_hash)
        return None if got is None else got[1]

    def put_l3(self, blocks: list[KVBlock]) -> tuple[list[bytes], list[bytes]]:
        return self._put([b.block_hash for b in blocks])

    def spill_l3(self, h: bytes) -> tuple[list[bytes], list[bytes]]:
        return self._put([h])

    def _put(self, hashes: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        new, gone = self.store.put(hashes, self.now)
        written = set(new)
        present = [h for h in hashes if h in self.store.blocks and h not in written]   # held already
        self.put_blocks += len(new)
        self._removed.extend(gone)
        return new, present

    def load(self, seq: Sequence, first_block: int, n_l2: int, n_l3: int) -> LoadResult:
        hashes = seq.full_block_hashes()
        ok2 = 0
        for h in hashes[first_block:first_block + n_l2]:
            if self.l2.get(h) is None:
                break
            ok2 += 1
        self.load_s += ok2 * self.block_bytes / self.dram_bytes_s
        if ok2 < n_l2 or not n_l3:
            return LoadResult(ok2, 0)
        start = first_block + ok2
        ok3 = self.store.count_prefix(hashes[start:start + n_l3], self.now)   # a get leases them too
        if ok3:
            self.load_s += self.store.link.transfer(self.now, ok3 * self.l3_block_bytes, self.nic_bytes_s)
        return LoadResult(ok2, ok3)

    @property
    def overlaps_loads(self) -> bool:
        return self.overlap

    def start_load(self, seq: Sequence, first_block: int, n_l2: int, n_l3: int) -> tuple[float, LoadResult]:
        before = self.load_s
        got = self.load(seq, first_block, n_l2, n_l3)
        at = self.now + (self.load_s - before)
        self.load_s = before
        self._landings.append(at)
        return at, got

    def poll_load(self, handle: tuple[float, LoadResult]) -> LoadResult | None:
        at, got = handle
        if self.now < at:
            return None
        self._landings.remove(at)
        return got

    def next_landing(self) -> float | None:
        """When the earliest started load lands (``None``: none in flight)."""
        return min(self._landings) if self._landings else None

    def take_l3_removed(self) -> list[bytes]:
        gone, self._removed = self._removed, []
        return gone

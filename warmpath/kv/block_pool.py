"""A pool of fixed-size KV blocks with a prefix cache (the L1 bookkeeping).

Blocks are identified by integer ids that index the device KV tensors. A block is
*in use* while ``ref_cnt > 0``. Freed blocks go to an LRU free queue but keep
their hash, so a later request with the same prefix can take them back
(a prefix-cache hit) until they are evicted for a new allocation.

NOTE: no torch here; the simulator runs this class unchanged.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from warmpath.kv.hashing import BlockHash


@dataclass
class KVBlock:
    """Metadata of one KV block.

    ``block_hash``/``token_ids`` are set once the block is full and sealed; a
    cached block is found by hash and confirmed by comparing its tokens. ``parent_hash``
    (``None`` for a first block) and ``prefix_digest`` are set with them when the pool
    keeps identities (the lower tiers need them to write verifiable copies).
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] | None = None
    parent_hash: BlockHash | None = None
    prefix_digest: bytes | None = None


@dataclass
class BlockPoolStats:
    """Counters kept by the pool (read by metrics)."""

    queries: int = 0       # blocks looked up
    hits: int = 0          # blocks found (tokens matched)
    collisions: int = 0    # hash matched but tokens did not
    evictions: int = 0     # cached blocks dropped for reuse


EvictHook = Callable[[KVBlock], None]


@dataclass
class BlockPool:
    """Fixed set of blocks, an O(1) LRU free queue and a hash → block map.

    Args:
        num_blocks: total blocks (ids ``0..num_blocks-1``).
        enable_caching: keep freed full blocks findable by hash.
        keep_identity: sealed blocks also record their parent hash and prefix digest
            (set by the lower tiers; the simulator leaves it off).
    """

    num_blocks: int
    enable_caching: bool = True
    keep_identity: bool = False
    blocks: list[KVBlock] = field(init=False)
    stats: BlockPoolStats = field(init=False, default_factory=BlockPoolStats)
    # block_id -> None, ordered from least- to most-recently freed.
    _free: "OrderedDict[int, None]" = field(init=False)
    _cached: dict[BlockHash, int] = field(init=False, default_factory=dict)
    _evict_hooks: list[EvictHook] = field(init=False, default_factory=list)
    _seal_hooks: list[EvictHook] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {self.num_blocks}")
        self.blocks = [KVBlock(i) for i in range(self.num_blocks)]
        self._free = OrderedDict((i, None) for i in range(self.num_blocks))

    # -- queries ---------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free, cached or not)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (0.0 – 1.0)."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks currently findable by hash (in use or free)."""
        return len(self._cached)

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int]) -> KVBlock | None:
        """Return the cached block with this hash and these tokens, else ``None``."""
        self.stats.queries += 1
        bid = self._cached.get(block_hash)
        if bid is None:
            return None
        blk = self.blocks[bid]
        if blk.token_ids != tuple(token_ids):
            self.stats.collisions += 1
            return None
        self.stats.hits += 1
        return blk

    # -- mutations -------------------------------------------------------
    def add_evict_hook(self, hook: EvictHook) -> None:
        """Call ``hook(block)`` just before a cached block loses its hash."""
        self._evict_hooks.append(hook)

    def add_seal_hook(self, hook: EvictHook) -> None:
        """Call ``hook(block)`` when a block is registered under its hash."""
        self._seal_hooks.append(hook)

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cached blocks found by :meth:`lookup`."""
        for blk in blocks:
            if blk.ref_cnt == 0:
                del self._free[blk.block_id]
            blk.ref_cnt += 1

    def allocate(self, n: int) -> list[KVBlock]:
        """Allocate ``n`` blocks (LRU eviction of cached free blocks).

        Raises:
            MemoryError: if fewer than ``n`` blocks are free (nothing changes).
        """
        if n > len(self._free):
            raise MemoryError(f"need {n} blocks, {len(self._free)} free")
        out = []
        for _ in range(n):
            bid, _ = self._free.popitem(last=False)
            blk = self.blocks[bid]
            if blk.block_hash is not None:
                self._evict(blk)
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def seal(self, blk: KVBlock, block_hash: BlockHash, token_ids: Sequence[int],
             parent_hash: BlockHash | None = None, prefix_digest: bytes | None = None) -> None:
        """Register a full block under its hash (with its parent's and its prefix digest).

        NOTE: if another block already holds this hash (two requests computed the
        same prefix concurrently) the first one stays canonical and ``blk`` is
        left uncached; it is freed normally later.
        """
        if blk.block_hash is not None or not self.enable_caching:
            return
        if block_hash in self._cached:
            return
        blk.block_hash = block_hash
        blk.token_ids = tuple(token_ids)
        blk.parent_hash, blk.prefix_digest = parent_hash, prefix_digest
        self._cached[block_hash] = blk.block_id
        for hook in self._seal_hooks:
            hook(blk)

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue.

        Pass blocks in eviction-priority order (first = evicted first); a
        sequence frees its tail first so shared prefixes live longest.
        """
        for blk in blocks:
            if blk.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {blk.block_id}")
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                if blk.block_hash is None:
                    # Uncached blocks are worthless: reuse them first.
                    self._free[blk.block_id] = None
                    self._free.move_to_end(blk.block_id, last=False)
                else:
                    self._free[blk.block_id] = None

    def evict_cached(self) -> int:
        """Forget every free cached block (reset of the prefix cache)."""
        n = 0
        for bid in list(self._free):
            blk = self.blocks[bid]
            if blk.block_hash is not None:
                self._evict(blk)
                n += 1
        return n

    def _evict(self, blk: KVBlock) -> None:
        for hook in self._evict_hooks:
            hook(blk)
        del self._cached[blk.block_hash]
        blk.block_hash = blk.parent_hash = blk.prefix_digest = None
        blk.token_ids = None
        self.stats.evictions += 1

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if the pool's invariants do not hold."""
        free_ids = set(self._free)
        assert len(free_ids) == len(self._free)
        for blk in self.blocks:
            assert blk.ref_cnt >= 0, f"block {blk.block_id} ref_cnt {blk.ref_cnt}"
            assert (blk.ref_cnt == 0) == (blk.block_id in free_ids), \
                f"block {blk.block_id}: ref_cnt {blk.ref_cnt}, in free queue {blk.block_id in free_ids}"
            if blk.block_hash is not None:
                assert self._cached.get(blk.block_hash) == blk.block_id
                assert blk.token_ids is not None
                assert blk.prefix_digest is not None or not self.keep_identity
        for h, bid in self._cached.items():
            assert self.blocks[bid].block_hash == h

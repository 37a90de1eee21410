"""Per-sequence KV block allocation on top of :class:`BlockPool` (prefix reuse, sealing).

NOTE: no torch here.
"""

from __future__ import annotations

from typing import Sequence as Seq

from warmpath.engine.sequence import Sequence
from warmpath.kv.block_pool import BlockPool, KVBlock


class BlockManager:
    """Maps sequences to blocks of a :class:`BlockPool`.

    Args:
        pool: the block pool (L1).
        block_size: tokens per block.
    """

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.pool = pool
        self.block_size = block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[KVBlock]:
        """Longest run of cached blocks at the start of ``seq`` (tokens compared).

        NOTE: at most ``num_tokens - 1`` tokens can come from the cache: the last
        token is always computed so the step yields logits to sample from.
        """
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hashes = seq.full_block_hashes()[:max_blocks]
        tokens = seq.token_ids
        out: list[KVBlock] = []
        for i, h in enumerate(hashes):
            blk = self.pool.lookup(h, tokens[i * bs:(i + 1) * bs])
            if blk is None:
                break
            out.append(blk)
        return out

    def can_allocate(self, seq: Sequence, num_new_tokens: int,
                     computed: Seq[KVBlock] = ()) -> bool:
        """Whether :meth:`allocate_slots` would succeed."""
        return self._needed(seq, num_new_tokens, computed) <= self._free_after_touch(computed)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       computed: Seq[KVBlock] = ()) -> bool:
        """Reserve blocks so ``seq`` can compute ``num_new_tokens`` more tokens.

        ``computed`` are cached prefix blocks from :meth:`match_prefix` (only for a
        sequence that holds no blocks yet); they are referenced and counted as
        computed. Returns ``False`` and changes nothing when blocks are short.
        """
        if computed and seq.block_ids:
            raise ValueError("cached prefix blocks can only start a sequence's block table")
        need = self._needed(seq, num_new_tokens, computed)
        if need > self._free_after_touch(computed):
            return False
        if computed:
            self.pool.touch(computed)
            seq.block_ids.extend(b.block_id for b in computed)
            seq.num_computed_tokens += len(computed) * self.block_size
            seq.num_sealed_blocks = len(computed)
        if need > 0:
            seq.block_ids.extend(b.block_id for b in self.pool.allocate(need))
        return True

    def seal_full_blocks(self, seq: Sequence) -> list[KVBlock]:
        """Register newly filled, computed blocks in the prefix cache; returns them."""
        bs = self.block_size
        n_full = seq.num_computed_tokens // bs
        if n_full <= seq.num_sealed_blocks:
            return []
        hashes = seq.full_block_hashes()
        digests = seq.full_block_digests() if self.pool.keep_identity else None
        tokens = seq.token_ids
        sealed = []
        for i in range(seq.num_sealed_blocks, n_full):
            blk = self.pool.blocks[seq.block_ids[i]]
            self.pool.seal(blk, hashes[i], tokens[i * bs:(i + 1) * bs], hashes[i - 1] if i else None,
                           digests[i] if digests is not None else None)
            sealed.append(blk)
        seq.num_sealed_blocks = n_full
        return sealed

    def free(self, seq: Sequence) -> None:
        """Release all of ``seq``'s blocks (tail first, so prefixes outlive suffixes)."""
        self.pool.free([self.pool.blocks[b] for b in reversed(seq.block_ids)])
        seq.block_ids = []
        seq.num_sealed_blocks = 0

    # -- helpers ---------------------------------------------------------
    def _needed(self, seq: Sequence, num_new: int, computed: Seq[KVBlock]) -> int:
        total = seq.num_computed_tokens + len(computed) * self.block_size + num_new
        return max(0, self.blocks_for(total) - len(seq.block_ids) - len(computed))

    def _free_after_touch(self, computed: Seq[KVBlock]) -> int:
        return self.pool.num_free - sum(1 for b in computed if b.ref_cnt == 0)

"""Default sizes of the KV tiers, from the model rather than fixed GiB.

A fixed 1 GiB L1 + 1 GiB L2 per worker and a 2 GiB store were ~3x what SmolLM2-135M
(45 KiB of float32 KV per token, an 8,192-token context) can use on this kind of machine,
and too little for a model with long contexts. When ``--kv-cache-gib`` / ``--l2-gib`` /
``--l3-gib`` are not given:

* **L1** holds one full context window (``max_model_len`` tokens): the smallest pool that
  admits every request the context allows (llama.cpp sizes its cache to ``n_ctx`` the same
  way), and at least one block per sequence the scheduler may run;
* **L2** holds as many blocks as L1: every block L1 evicts can stay a while longer, at the
  cost of the same memory again;
* **L3** (the store a cluster starts for itself) holds about as many blocks as all the
  workers' L1 pools together, so that what any worker wrote is still there when another
  one needs it.

For SmolLM2-135M in float32 with blocks of 16 tokens: L1 = L2 = 512 blocks (360 MiB) per
worker, a 1,080 MiB store for the three workers of ``cpd-1d``. On CPU the pools are
committed page by page as blocks are first written (``host_pool.lazy_zeros``), so a pool
costs resident memory only once used.
"""

from __future__ import annotations

GIB = 1 << 30
L1_CONTEXTS = 1     # full context windows in a default L1 pool


def auto_blocks(max_model_len: int, block_size: int, max_num_seqs: int) -> int:
    """L1 blocks when no size is given: ``L1_CONTEXTS`` context windows, and at least one
    block for each of ``max_num_seqs`` sequences (rounded up to whole blocks)."""
    if min(max_model_len, block_size, max_num_seqs) <= 0:
        raise ValueError(f"max_model_len, block_size and max_num_seqs must be > 0, got "
                         f"{max_model_len}, {block_size}, {max_num_seqs}")
    tokens = max(L1_CONTEXTS * max_model_len, max_num_seqs * block_size)
    return -(-tokens // block_size)


def blocks_in(gib: float, block_bytes: int) -> int:
    """Blocks of ``block_bytes`` that fit in ``gib`` GiB (at least one)."""
    return max(1, int(gib * GIB) // block_bytes)


def store_bytes(workers: int, l1_blocks: int, block_bytes: int) -> int:
    """Default memory of a cluster's own L3 store: as many blocks as the ``workers``' L1
    pools of ``l1_blocks`` each."""
    return workers * l1_blocks * block_bytes


def l1_blocks(gib: float | None, block_bytes: int, max_model_len: int, block_size: int,
              max_num_seqs: int) -> int:
    """L1 blocks for ``--kv-cache-gib`` ``gib`` (``None``: :func:`auto_blocks`)."""
    if gib is None:
        return auto_blocks(max_model_len, block_size, max_num_seqs)
    return blocks_in(gib, block_bytes)

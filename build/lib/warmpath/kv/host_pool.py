"""L2: a host-DRAM pool of KV blocks (pinned on CUDA), indexed by block hash with LRU."""

from __future__ import annotations

import torch

from warmpath.kv.hashing import BlockHash
from warmpath.kv.lru_index import LRUSlotIndex


class HostKVPool:
    """``capacity`` block slots, each ``[layers, 2, block_size, kv_heads, head_dim]``.

    Args:
        capacity: blocks held at most (0 disables L2).
        block_shape: shape of one block.
        dtype: KV dtype.
        pin: pin the memory (set when the L1 pool is on CUDA, for async copies).
    """

    def __init__(self, capacity: int, block_shape: tuple[int, ...], dtype: torch.dtype,
                 pin: bool = False) -> None:
        self.index = LRUSlotIndex(capacity)
        self.block_shape = block_shape
        self.data = torch.zeros((capacity, *block_shape), dtype=dtype, pin_memory=pin and capacity > 0)
        self.bytes_written = 0
        self.bytes_read = 0

    @staticmethod
    def capacity_for(gib: float, block_shape: tuple[int, ...], dtype: torch.dtype) -> int:
        per = torch.Size(block_shape).numel() * torch.empty(0, dtype=dtype).element_size()
        return int(gib * (1 << 30)) // per

    @property
    def block_bytes(self) -> int:
        return self.data[0].numel() * self.data.element_size() if len(self.data) else 0

    def __contains__(self, h: BlockHash) -> bool:
        return h in self.index

    def put(self, h: BlockHash, src: torch.Tensor) -> BlockHash | None:
        """Copy ``src`` in under ``h``; returns the hash evicted to make room (if any).

        A caller that must save the victim (write-back) reads it with
        :meth:`peek_victim` before calling this, which overwrites its slot.
        """
        got = self.index.insert(h)
        if got is None:
            return None
        slot, evicted = got
        self.data[slot].copy_(src, non_blocking=True)
        self.bytes_written += self.block_bytes
        return evicted

    def peek_victim(self) -> tuple[BlockHash, torch.Tensor] | None:
        """The entry the next insert would evict (when full), with its data."""
        old = self.index.oldest()
        return None if old is None else (old[0], self.data[old[1]])

    def get(self, h: BlockHash) -> torch.Tensor | None:
        """The stored block (marked recently used), or ``None``."""
        slot = self.index.get(h)
        if slot is None:
            return None
        self.bytes_read += self.block_bytes
        return self.data[slot]

    def count_prefix(self, hashes: list[BlockHash]) -> int:
        """How many leading ``hashes`` L2 holds."""
        return self.index.count_prefix(hashes)

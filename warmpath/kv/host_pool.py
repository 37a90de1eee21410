"""L2: a host-DRAM pool of KV blocks (pinned on CUDA), indexed by block hash with LRU.

Each slot remembers the identity of the block it holds (``kv/block_codec.py``) and,
with ``checksum``, the xxh3-128 of its bytes; :meth:`HostKVPool.get` returns a block only
if it is the one asked for and its bytes are intact.
"""

from __future__ import annotations

import math
import mmap

import torch

from warmpath.kv.block_codec import BROKEN, BlockIdentity, payload_checksum
from warmpath.kv.hashing import BlockHash
from warmpath.kv.lru_index import LRUSlotIndex


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cpu",
               pin: bool = False) -> torch.Tensor:
    """A zero tensor; on CPU (unpinned) its pages are committed only when first written.

    NOTE: ``torch.zeros`` writes every byte, so a KV pool cost its full size in RSS from
    the start; an anonymous mapping reads as zeros and the kernel backs each page on first
    write, so a pool costs what its used blocks occupy (up to its capacity). Pinned and
    device memory is allocated as usual.
    """
    device = torch.device(device)
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if device.type != "cpu" or pin or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin and nbytes > 0)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # private: no shmem
    return torch.frombuffer(buf, dtype=dtype).view(shape)


class HostKVPool:
    """``capacity`` block slots, each ``[layers, 2, block_size, kv_heads, head_dim]``.

    Args:
        capacity: blocks held at most (0 disables L2).
        block_shape: shape of one block.
        dtype: KV dtype.
        pin: pin the memory (set when the L1 pool is on CUDA, for async copies).
        checksum: checksum each block's bytes when stored (synchronously) and check them when
            loaded; off, a block's identity is still checked.
    """

    def __init__(self, capacity: int, block_shape: tuple[int, ...], dtype: torch.dtype,
                 pin: bool = False, checksum: bool = False) -> None:
        self.index = LRUSlotIndex(capacity)
        self.block_shape = block_shape
        self.data = lazy_zeros((capacity, *block_shape), dtype, pin=pin)
        self.checksum = checksum
        self.idents: list[BlockIdentity | None] = [None] * capacity
        self.sums: list[bytes | None] = [None] * capacity
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

    def put(self, ident: BlockIdentity, src: torch.Tensor) -> BlockHash | None:
        """Copy ``src`` in as the block ``ident``; returns the hash evicted to make room.

        A caller that must save the victim (write-back) reads it with
        :meth:`peek_victim` before calling this, which overwrites its slot.
        """
        got = self.index.insert(ident.block_hash)
        if got is None:
            return None
        slot, evicted = got
        self.data[slot].copy_(src, non_blocking=not self.checksum)
        self.idents[slot] = ident
        self.sums[slot] = self._sum(slot) if self.checksum else None
        self.bytes_written += self.block_bytes
        return evicted

    def peek_victim(self) -> tuple[BlockIdentity, torch.Tensor] | None:
        """The entry the next insert would evict (when full): its identity and data."""
        old = self.index.oldest()
        return None if old is None else (self.idents[old[1]], self.data[old[1]])

    def get(self, want: BlockIdentity) -> tuple[torch.Tensor | None, str | None]:
        """``(data, None)`` for the stored block ``want`` (marked recently used);
        ``(None, None)`` if absent; ``(None, reason)`` if the slot holds something else
        (a broken one is dropped, see :data:`~warmpath.kv.block_codec.BROKEN`)."""
        slot = self.index.get(want.block_hash)
        if slot is None:
            return None, None
        reason = self._mismatch(slot, want)
        if reason is not None:
            if reason in BROKEN:
                self.index.remove(want.block_hash)
            return None, reason
        self.bytes_read += self.block_bytes
        return self.data[slot], None

    def count_prefix(self, hashes: list[BlockHash]) -> int:
        """How many leading ``hashes`` L2 holds."""
        return self.index.count_prefix(hashes)

    def _sum(self, slot: int) -> bytes:
        # NOTE: the copy in put() is synchronous when checksumming, so the bytes are there.
        return payload_checksum(self.data[slot].view(-1).view(torch.uint8).numpy())

    def _mismatch(self, slot: int, want: BlockIdentity) -> str | None:
        have = self.idents[slot]
        if have is None or have.block_hash != want.block_hash:
            return "key"
        for reason, a, b in (("tokens", have.tokens, want.tokens), ("parent", have.parent, want.parent),
                             ("prefix", have.digest, want.digest)):
            if a != b:
                return reason
        if self.checksum and self.sums[slot] is not None and self._sum(slot) != self.sums[slot]:
            return "checksum"
        return None

"""Block hashing shared by the engine, the router and the simulator.

Only *full* blocks are hashed. The hash of block i is a stable 128-bit xxhash of
``(namespace digest, parent hash, token ids of block i)`` so that:

* equal prefixes give equal hash chains in every process and on every machine
  (never Python's ``hash``, which is salted per process);
* KV is never reused across model versions, dtypes, block sizes, tokenizers,
  adapters or tenants: all of those are folded into the namespace.

NOTE: this module imports no torch; the router and simulator depend on that.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

import xxhash

BlockHash = bytes  # 16 bytes


@dataclass(frozen=True)
class KVNamespace:
    """Everything that makes KV of the same tokens incompatible.

    Attributes:
        model_id: model name or path identity.
        revision: model revision / weights digest.
        dtype: KV dtype name, e.g. ``"float32"``.
        block_size: tokens per block.
        tokenizer: tokenizer identity (digest of its vocabulary).
        adapter: LoRA / adapter id, ``""`` when none.
        cache_salt: optional per-tenant salt; different salts never share blocks.
    """

    model_id: str
    revision: str
    dtype: str
    block_size: int
    tokenizer: str = ""
    adapter: str = ""
    cache_salt: str = ""

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {self.block_size}")
        if not self.model_id:
            raise ValueError("model_id must be non-empty")

    def with_salt(self, cache_salt: str | None) -> "KVNamespace":
        """The same namespace for another tenant salt."""
        salt = cache_salt or ""
        if salt == self.cache_salt:
            return self
        return KVNamespace(self.model_id, self.revision, self.dtype, self.block_size,
                           self.tokenizer, self.adapter, salt)

    @property
    def digest(self) -> bytes:
        """Stable 16-byte digest of all fields (memoised)."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            parts = [self.model_id, self.revision, self.dtype, str(self.block_size),
                     self.tokenizer, self.adapter, self.cache_salt]
            cached = xxhash.xxh3_128_digest("\x1f".join(parts).encode("utf-8"))
            object.__setattr__(self, "_digest", cached)
        return cached


def _pack_tokens(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def hash_block(namespace: KVNamespace, parent: BlockHash | None,
               tokens: Sequence[int]) -> BlockHash:
    """Hash one full block given its parent's hash (``None`` for the first block)."""
    if len(tokens) != namespace.block_size:
        raise ValueError(f"only full blocks are hashed: got {len(tokens)} tokens, "
                         f"block_size={namespace.block_size}")
    h = xxhash.xxh3_128()
    h.update(namespace.digest)
    h.update(parent if parent is not None else b"\x00" * 16)
    h.update(_pack_tokens(tokens))
    return h.digest()


def hash_prefix_blocks(namespace: KVNamespace, tokens: Sequence[int],
                       start_hashes: Iterable[BlockHash] = ()) -> list[BlockHash]:
    """Hash chain of every full block of ``tokens``.

    ``start_hashes`` may hold already-known hashes of the first blocks (for
    incremental hashing as a sequence grows); they are returned unchanged and
    only the blocks after them are hashed.
    """
    out = list(start_hashes)
    bs, first, n = namespace.block_size, len(out), len(tokens) // namespace.block_size
    if first >= n:
        return out
    # the same bytes hash_block feeds its hasher, packed once and hashed in one call per block
    buf, head, step = _pack_tokens(tokens[first * bs:n * bs]), namespace.digest, 4 * bs
    parent = out[-1] if out else b"\x00" * 16
    for off in range(0, len(buf), step):
        parent = xxhash.xxh3_128_digest(head + parent + buf[off:off + step])
        out.append(parent)
    return out

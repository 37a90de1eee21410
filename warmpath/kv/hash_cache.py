"""Block hashes of recent prompts, reused for the next prompt that extends one of them.

A follow-up turn of a chat or coding-agent session repeats the session's previous prompt
(and its answer) as a prefix. :class:`BlockHashCache` remembers the last prompts' packed
tokens and hash chains; for a new prompt it finds the longest common token prefix with the
previous prompt of the same session (else with the last prompt that began with the same
first block), takes the hashes of the fully common blocks from there and hashes only the
blocks after them. The result is bit-identical to :func:`~warmpath.kv.hashing.hash_prefix_blocks`:
a block's hash depends on the namespace and every token up to its end, and the reused blocks
have exactly those tokens (compared, not assumed) under the same namespace.

The chains are :class:`~warmpath.kv.keychain.KeyChain` s: the keys back to back in one
buffer, written there by the C hasher and read there by the index's lookups, so hashing a
prompt makes no Python object per block (``KeyChain.keys()`` makes them for a caller that
needs them).

Memory: at most ``max_entries`` remembered prompts and ``max_tokens`` tokens in all (the
least recently used go first); a prompt costs 4 bytes a token (packed ids) plus 16 bytes a
block (its chain): 5 bytes a token at 16-token blocks, ~20 MB at the default 4M tokens.

NOTE: thread-safe (one lock around the table; hashing runs outside it). No torch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from warmpath.kv.hashing import NO_PARENT, KVNamespace, _blockhash, hash_packed_keys, pack_tokens
from warmpath.kv.keychain import KEY, KeyChain


@dataclass(frozen=True)
class _Entry:
    packed: bytes                       # the prompt's tokens, little-endian u32
    hashes: KeyChain                    # one key per full block


def common_blocks(a: bytes, b: bytes, block_size: int) -> int:
    """Leading full blocks (of ``block_size`` u32 tokens) on which packed ``a`` and ``b``
    agree token for token."""
    if _blockhash is not None:
        return _blockhash.common_blocks(a, b, block_size)
    step = 4 * block_size
    n = min(len(a), len(b)) // step
    if n == 0:
        return 0
    end = n * step
    if a[:end] == b[:end]:             # the usual follow-up: one memcmp
        return n
    diff = np.frombuffer(a, np.uint32, end // 4) != np.frombuffer(b, np.uint32, end // 4)
    return int(diff.argmax()) // block_size


class BlockHashCache:
    """``cache.hashes(ns, tokens, key)``: ``hash_prefix_blocks(ns, tokens)`` as a
    :class:`~warmpath.kv.keychain.KeyChain`, reusing the blocks ``tokens`` shares with the
    session ``key``'s last prompt.

    Args:
        max_entries: prompts remembered (least recently used dropped first).
        max_tokens: tokens remembered over all entries.
    """

    def __init__(self, max_entries: int = 1024, max_tokens: int = 1 << 22) -> None:
        if max_entries <= 0 or max_tokens <= 0:
            raise ValueError(f"max_entries and max_tokens must be > 0, got {max_entries}, {max_tokens}")
        self.max_entries, self.max_tokens = max_entries, max_tokens
        self._table: OrderedDict[tuple, _Entry] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.reused_blocks = 0          # blocks whose hash came from an earlier prompt
        self.hashed_blocks = 0          # blocks hashed here

    def __len__(self) -> int:
        return len(self._table)

    def hashes(self, namespace: KVNamespace, tokens: Sequence[int], key: str | None = None) -> KeyChain:
        """The block hash chain of ``tokens`` (every full block; equal to the tuple of
        :func:`~warmpath.kv.hashing.hash_prefix_blocks`), remembered for the next
        prompt of session ``key`` and for any later prompt with the same first block.
        ``tokens``: ids as a list or, with no Python int per id, an ``array('I')``
        (:func:`~warmpath.kv.hashing.token_array`)."""
        packed = pack_tokens(tokens)
        step = 4 * namespace.block_size
        ns = namespace.digest
        keys = [(ns, "first", packed[:step])] if len(packed) >= step else []
        if key is not None:
            keys.insert(0, (ns, "key", key))
        with self._lock:
            prev = next((e for e in map(self._table.get, keys) if e is not None), None)
        k = common_blocks(packed, prev.packed, namespace.block_size) if prev is not None else 0
        reused = memoryview(prev.hashes.buf)[:KEY * k] if k else b""
        out = KeyChain(hash_packed_keys(namespace, memoryview(packed)[k * step:],
                                        bytes(reused[-KEY:]) if k else NO_PARENT, reused))
        entry = _Entry(packed, out)
        with self._lock:
            self.reused_blocks += k
            self.hashed_blocks += len(out) - k
            for kk in keys:
                self._put(kk, entry)
        return out

    def _put(self, key: tuple, entry: _Entry) -> None:
        old = self._table.pop(key, None)
        if old is not None:
            self._tokens -= len(old.packed) // 4
        n = len(entry.packed) // 4
        if n > self.max_tokens:
            return                       # larger than the whole budget: not remembered
        self._table[key] = entry         # inserted last: dict order is LRU order
        self._tokens += n
        while len(self._table) > self.max_entries or self._tokens > self.max_tokens:
            _, gone = self._table.popitem(last=False)
            self._tokens -= len(gone.packed) // 4

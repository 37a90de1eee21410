"""Block hashing shared by the engine, the router and the simulator.

Only *full* blocks are hashed. The hash of block i is a stable 128-bit xxhash of
``(namespace digest, parent hash, token ids of block i)`` so that:

* equal prefixes give equal hash chains in every process and on every machine
  (never Python's ``hash``, which is salted per process);
* KV is never reused across model versions, dtypes, block sizes, tokenizers,
  adapters or tenants: all of those are folded into the namespace.

The xxh3 chain is the key everywhere (L1 map, L2 index, L3 key, KV events, router index);
it is fast but not collision resistant. A block loaded from L2 or L3 is therefore also
checked against a BLAKE2b-256 chain over the same tokens (:func:`digest_prefix_blocks`,
``kv/block_codec.py``), so a key collision, accidental or crafted, costs a miss, never
another prefix's KV.

The chain runs in C when ``warmpath.kv._blockhash`` is built (``native/blockhash.c``, built
by the install step, ``setup.py``): one call hashes every block with the GIL released, the
same bytes as the Python loop below (``NATIVE`` says which one runs; the tests compare them);
:func:`hash_packed_keys` writes the keys into one buffer instead of a ``bytes`` per block.
Token ids may come as a list or, without per-token Python ints, as :func:`token_array`'s
``array('I')`` (or a numpy uint32 array): packing those is one copy.

NOTE: this module imports no torch; the router and simulator depend on that.
"""

from __future__ import annotations

import array
import hashlib
import struct
import sys
from dataclasses import dataclass
from typing import Iterable, Sequence

import xxhash

try:
    from warmpath.kv import _blockhash
except ImportError:        # not built (no C compiler at install): the Python loop, same keys
    _blockhash = None

NATIVE = _blockhash is not None
# A set of 16-byte block keys (add, update, in, len, iter, clear): the C one stores them inline
# (one cache line a probe); Python's set where the extension is not built.
KeySet = _blockhash.KeySet if _blockhash is not None else set
BlockHash = bytes  # 16 bytes
NO_PARENT = b"\x00" * 16   # the parent hash of a sequence's first block


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

    @property
    def strong_digest(self) -> bytes:
        """32-byte BLAKE2b of all fields, each length-prefixed (memoised): the root of
        :func:`digest_prefix_blocks`."""
        cached = self.__dict__.get("_strong")
        if cached is None:
            h = hashlib.blake2b(digest_size=32, person=b"warmpath-ns")
            for part in (self.model_id, self.revision, self.dtype, str(self.block_size),
                         self.tokenizer, self.adapter, self.cache_salt):
                raw = part.encode("utf-8")
                h.update(len(raw).to_bytes(4, "little") + raw)
            cached = h.digest()
            object.__setattr__(self, "_strong", cached)
        return cached


# NOTE: array('I') packs a list of ints about twice as fast as struct.pack; its bytes are the
# same little-endian u32 only on a little-endian machine with a 4-byte unsigned int.
_ARRAY_U32 = array.array("I").itemsize == 4 and sys.byteorder == "little"
_U32 = "uint32"


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian u32 (the bytes every block hash and digest reads); an
    ``array('I')`` or a numpy uint32 array (:func:`token_array`) is copied as it is."""
    if _ARRAY_U32:
        if isinstance(tokens, array.array) and tokens.typecode == "I":
            return tokens.tobytes()
        if _blockhash is not None and type(tokens) in (list, tuple):
            try:
                return _blockhash.pack(tokens)
            except (TypeError, OverflowError):
                pass   # struct.pack below raises the error it always raised (struct.error)
        elif getattr(tokens, "dtype", None) == _U32:
            return tokens.tobytes()       # a numpy uint32 array (little-endian: _ARRAY_U32)
        else:
            try:
                return array.array("I", tokens).tobytes()
            except (TypeError, OverflowError):
                pass
    return struct.pack(f"<{len(tokens)}I", *tokens)


def token_array(tokens: Sequence[int]) -> array.array:
    """``tokens`` as a compact ``array('I')`` (4 bytes an id, no Python int per id): the form
    the router keeps a prompt in from its tokenizer to the block hasher; ``struct.error`` for
    an id outside [0, 2**32)."""
    if isinstance(tokens, array.array) and tokens.typecode == "I":
        return tokens
    out = array.array("I")
    out.frombytes(pack_tokens(tokens))
    return out


def hash_block(namespace: KVNamespace, parent: BlockHash | None,
               tokens: Sequence[int]) -> BlockHash:
    """Hash one full block given its parent's hash (``None`` for the first block)."""
    if len(tokens) != namespace.block_size:
        raise ValueError(f"only full blocks are hashed: got {len(tokens)} tokens, "
                         f"block_size={namespace.block_size}")
    h = xxhash.xxh3_128()
    h.update(namespace.digest)
    h.update(parent if parent is not None else NO_PARENT)
    h.update(pack_tokens(tokens))
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
    out += hash_packed_blocks(namespace, pack_tokens(tokens[first * bs:n * bs]), out[-1] if out else NO_PARENT)
    return out


def hash_packed_blocks(namespace: KVNamespace, packed: bytes, parent: BlockHash = NO_PARENT) -> list[BlockHash]:
    """Hash chain of every full block of ``packed`` (tokens as :func:`pack_tokens` gives
    them), the first block's parent being ``parent``: the hashes
    :func:`hash_prefix_blocks` gives for those blocks after a prefix whose last hash is
    ``parent``. Bytes after the last full block are ignored. ``packed``: any contiguous
    buffer (bytes, a memoryview of them, ``array('I')``)."""
    if _blockhash is not None:
        return _blockhash.chain(namespace.digest, parent, packed, namespace.block_size)
    return _chain_py(namespace, packed, parent)


def hash_packed_keys(namespace: KVNamespace, packed: bytes, parent: BlockHash = NO_PARENT,
                     prefix: bytes = b"") -> bytes:
    """``prefix`` then the keys :func:`hash_packed_blocks` gives, back to back in one ``bytes``
    (16 bytes a block; ``kv/keychain.py``): in C no Python object is made per block.
    ``prefix``: whole 16-byte keys (any buffer); ``parent``: the first block's parent."""
    if _blockhash is not None:
        return _blockhash.chain_keys(namespace.digest, parent, packed, namespace.block_size, prefix)
    if len(prefix) % 16:
        raise ValueError("prefix must be whole 16-byte keys")
    return bytes(prefix) + b"".join(_chain_py(namespace, packed, parent))


def _chain_py(namespace: KVNamespace, packed: bytes, parent: BlockHash = NO_PARENT) -> list[BlockHash]:
    """:func:`hash_packed_blocks` in Python (where the C chain is not built; the tests
    compare the two)."""
    packed = memoryview(packed).cast("B")
    step = 4 * namespace.block_size
    end = len(packed) // step * step
    if end == 0:
        return []
    # NOTE: the bytes hash_block feeds its hasher (namespace digest, parent, block), packed by
    # one precompiled Struct call per block from a C-level iterator over the blocks: the
    # fewest Python-level operations per block found (~1.4x the plain slice-and-concatenate
    # loop), same hashes.
    record = struct.Struct(f"16s16s{step}s").pack
    head, digest, out = namespace.digest, xxhash.xxh3_128_digest, []
    append = out.append
    for (block,) in struct.iter_unpack(f"{step}s", packed[:end]):
        parent = digest(record(head, parent, block))
        append(parent)
    return out


def digest_prefix_blocks(namespace: KVNamespace, tokens: Sequence[int],
                         start_digests: Iterable[bytes] = ()) -> list[bytes]:
    """BLAKE2b-256 chain of every full block of ``tokens``: digest i covers the namespace
    and every token up to the end of block i (``start_digests`` as in
    :func:`hash_prefix_blocks`). Only blocks that leave L1 need it (``kv/block_codec.py``)."""
    out = list(start_digests)
    bs, first, n = namespace.block_size, len(out), len(tokens) // namespace.block_size
    if first >= n:
        return out
    buf, step = pack_tokens(tokens[first * bs:n * bs]), 4 * bs
    digest = out[-1] if out else namespace.strong_digest
    for off in range(0, len(buf), step):
        digest = hashlib.blake2b(digest + buf[off:off + step], digest_size=32).digest()
        out.append(digest)
    return out

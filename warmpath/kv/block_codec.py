"""On-store layout of one KV block, and the check that a loaded block is the one asked for.

A stored block is a header then the raw tensor bytes. The header says what the bytes are
(which tokens, after which prefix) so that the reader can prove it got the right ones:

* ``block_hash``, the store key (the xxh3-128 chain of ``kv/hashing.py``): a block put
  under another key is caught;
* ``parent`` (the previous block's hash), ``tokens`` (this block's ids) and ``digest``
  (the BLAKE2b-256 chain over the namespace and every token up to this block's end): the
  reader compares all three with its own request, so a collision of the non-cryptographic
  key, accidental or crafted, is a miss and never another prefix's KV;
* ``checksum``: xxh3-128 of the payload (seeded from the secret when there is one) against
  bit flips, truncation and torn writes. A keyed BLAKE2b (or HMAC-SHA-256) over the payload
  would be a MAC but hashes ≤ 0.5 GB/s on one core, slower than the store (``docs/benchmarks/engine.md``);
* ``tag``: BLAKE2b-128 of the header and tokens, keyed with the cluster's secret: without
  it nobody can make a header a reader accepts. (Without a secret it is a plain checksum.)

Layout (little-endian): :data:`FIXED` (magic ``b"WPKV"``, version u16, dtype code u16,
token count u16, 2 pad bytes, shape 6 × u32 ``(layers, 2, block_size, kv_heads, head_dim,
0)``, payload length u64, block hash 16 B, parent 16 B, digest 32 B, checksum 16 B), the
16-byte tag, the token ids (u32 each), zero padding to a multiple of 64 bytes
(:func:`header_size`), then the payload.

Threat model and decisions: ``docs/kv_verify.md``.

NOTE: no torch here (numpy / memoryview only).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from typing import NamedTuple, Sequence

import xxhash

from warmpath.kv.hashing import NO_PARENT, pack_tokens

MAGIC = b"WPKV"
VERSION = 2
FIXED = struct.Struct("<4sHHH2x6IQ16s16s32s16s")
TAG_SIZE = 16
DTYPES = {"float32": 1, "bfloat16": 2, "float16": 3}
ITEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# A broken block (bad bytes, forged or mis-keyed header) is removed from its tier; a sound
# block of another prefix under the same key (a hash collision) is only not used.
BROKEN = frozenset({"format", "tag", "key", "checksum"})
REASONS = ("format", "tag", "key", "checksum", "tokens", "parent", "prefix")


class BlockVerifyError(ValueError):
    """A loaded block is not the one asked for; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class BlockIdentity(NamedTuple):
    """What a block is: its key, its parent's key, its prefix digest, its tokens (packed u32).
    (A tuple: one is built per block of every load.)"""

    block_hash: bytes
    parent: bytes
    digest: bytes
    tokens: bytes

    @classmethod
    def of(cls, block_hash: bytes, parent: bytes | None, digest: bytes,
           token_ids: Sequence[int]) -> "BlockIdentity":
        """From a block's hash, its parent's (``None``: first block), digest and token ids."""
        return cls(block_hash, parent or NO_PARENT, digest, pack_tokens(token_ids))


def header_size(block_size: int) -> int:
    """Header bytes before the payload of a block of ``block_size`` tokens."""
    return math.ceil((FIXED.size + TAG_SIZE + 4 * block_size) / 64) * 64


def derive_key(secret: str | None) -> bytes:
    """The tag / checksum key for a cluster secret (``b""``: none)."""
    if not secret:
        return b""
    return hashlib.blake2b(secret.encode("utf-8"), digest_size=32, person=b"warmpath-kvtag").digest()


def payload_checksum(payload, key: bytes = b"") -> bytes:
    """xxh3-128 of the payload, seeded from ``key``."""
    seed = int.from_bytes(key[:8], "little") if key else 0
    return xxhash.xxh3_128_digest(payload, seed)


def _tag(buf: memoryview, n_tokens: int, key: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=TAG_SIZE, key=key)
    h.update(buf[:FIXED.size])
    start = FIXED.size + TAG_SIZE
    h.update(buf[start:start + 4 * n_tokens])
    return h.digest()


def encode_block(buf: memoryview, ident: BlockIdentity, dtype: str, shape: tuple[int, ...],
                 payload: memoryview, key: bytes = b"") -> None:
    """Write the header describing ``ident`` and ``payload`` into ``buf[:header_size]``."""
    n = len(ident.tokens) // 4
    dims = tuple(shape) + (0,) * (6 - len(shape))
    FIXED.pack_into(buf, 0, MAGIC, VERSION, DTYPES[dtype], n, *dims, len(payload),
                    ident.block_hash, ident.parent, ident.digest, payload_checksum(payload, key))
    start = FIXED.size + TAG_SIZE
    buf[start:start + 4 * n] = ident.tokens
    buf[start + 4 * n:header_size(n)] = bytes(header_size(n) - start - 4 * n)
    buf[FIXED.size:start] = _tag(buf, n, key)


def verify_block(buf: memoryview, want: BlockIdentity, dtype: str, shape: tuple[int, ...],
                 key: bytes = b"") -> None:
    """Check a stored block (header + payload) against the block a request wants, or
    raise :class:`BlockVerifyError`. The cheap header checks run before the payload's."""
    n = len(want.tokens) // 4
    hs = header_size(n)
    if len(buf) < hs:
        raise BlockVerifyError("format", f"truncated header: {len(buf)} bytes")
    magic, ver, dt, ntok, *rest = FIXED.unpack_from(buf, 0)
    dims, length, (stored_hash, parent, digest, checksum) = tuple(rest[:6]), rest[6], rest[7:]
    want_dims = tuple(shape) + (0,) * (6 - len(shape))
    if magic != MAGIC or ver != VERSION:
        raise BlockVerifyError("format", f"bad magic/version {magic!r}/{ver}")
    if dt != DTYPES[dtype] or dims != want_dims or ntok != n:
        raise BlockVerifyError("format", f"layout: dtype {dt}, shape {dims}, {ntok} tokens; want {want_dims}")
    if length != math.prod(shape) * ITEM_BYTES[dtype] or len(buf) < hs + length:
        raise BlockVerifyError("format", f"payload of {length} bytes, {len(buf) - hs} present")
    if not hmac.compare_digest(bytes(buf[FIXED.size:FIXED.size + TAG_SIZE]), _tag(buf, n, key)):
        raise BlockVerifyError("tag", "header tag mismatch (forged, corrupt, or another secret)")
    if stored_hash != want.block_hash:
        raise BlockVerifyError("key", "the header names another block than its key")
    start = FIXED.size + TAG_SIZE
    if bytes(buf[start:start + 4 * n]) != want.tokens:
        raise BlockVerifyError("tokens", "token ids differ from the request's")
    if parent != want.parent:
        raise BlockVerifyError("parent", "parent hash differs from the request's")
    if digest != want.digest:
        raise BlockVerifyError("prefix", "prefix digest differs from the request's")
    if payload_checksum(buf[hs:hs + length], key) != checksum:
        raise BlockVerifyError("checksum", "payload checksum mismatch")

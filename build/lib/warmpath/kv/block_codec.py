"""On-store layout of one KV block: a fixed header then the raw tensor bytes.

Header (64 bytes, little-endian): magic ``b"WPKV"``, format version (u16), dtype code
(u16), shape (6 × u32: layers, 2, block_size, kv_heads, head_dim, 0), payload length
(u64), xxh3-64 checksum of the payload (u64), then the 16-byte block hash.
A block whose header, hash or checksum does not match is treated as a miss.

NOTE: no torch here (numpy views only).
"""

from __future__ import annotations

import struct

import xxhash

MAGIC = b"WPKV"
VERSION = 1
HEADER = struct.Struct("<4sHH6IQQ16s")
HEADER_SIZE = 64
assert HEADER.size <= HEADER_SIZE
DTYPES = {"float32": 1, "bfloat16": 2, "float16": 3}


class BlockFormatError(ValueError):
    """A stored block failed its header or checksum check."""


def encode_header(buf: memoryview, block_hash: bytes, dtype: str, shape: tuple[int, ...],
                  payload: memoryview) -> None:
    """Write the header for ``payload`` into ``buf[:HEADER_SIZE]``."""
    dims = tuple(shape) + (0,) * (6 - len(shape))
    HEADER.pack_into(buf, 0, MAGIC, VERSION, DTYPES[dtype], *dims, len(payload),
                     xxhash.xxh3_64_intdigest(payload), block_hash)


def check_block(buf: memoryview, block_hash: bytes, dtype: str, shape: tuple[int, ...]) -> None:
    """Validate a stored block (header + payload) or raise :class:`BlockFormatError`."""
    if len(buf) < HEADER_SIZE:
        raise BlockFormatError(f"truncated block: {len(buf)} bytes")
    magic, ver, dt, *rest = HEADER.unpack_from(buf, 0)
    dims, length, checksum, stored_hash = rest[:6], rest[6], rest[7], rest[8]
    want = tuple(shape) + (0,) * (6 - len(shape))
    if magic != MAGIC or ver != VERSION:
        raise BlockFormatError(f"bad magic/version {magic!r}/{ver}")
    if dt != DTYPES[dtype] or tuple(dims) != want:
        raise BlockFormatError(f"layout mismatch: dtype {dt}, shape {dims}, want {want}")
    if stored_hash != block_hash:
        raise BlockFormatError("block hash mismatch")
    payload = buf[HEADER_SIZE:HEADER_SIZE + length]
    if len(payload) != length:
        raise BlockFormatError(f"truncated payload: {len(payload)} of {length} bytes")
    if xxhash.xxh3_64_intdigest(payload) != checksum:
        raise BlockFormatError("checksum mismatch")

"""The stored block's header and its check, worked out by hand on a 2-block chain."""

import hashlib
import struct

import numpy as np
import pytest
import xxhash

from warmpath.kv.block_codec import (BROKEN, FIXED, BlockIdentity, BlockVerifyError, derive_key, encode_block,
                                     header_size, payload_checksum, verify_block)
from warmpath.kv.hashing import NO_PARENT, KVNamespace, digest_prefix_blocks, hash_prefix_blocks

SHAPE = (2, 2, 4, 1, 8)          # 2 layers, K/V, 4 tokens, 1 head, 8 dims: 128 float32 = 512 bytes
NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=4)
TOKENS = [11, 12, 13, 14, 21, 22, 23, 24]
HASHES = hash_prefix_blocks(NS, TOKENS)
DIGESTS = digest_prefix_blocks(NS, TOKENS)
B0 = BlockIdentity.of(HASHES[0], None, DIGESTS[0], TOKENS[:4])
B1 = BlockIdentity.of(HASHES[1], HASHES[0], DIGESTS[1], TOKENS[4:])
HS = 192                         # 124 fixed + 16 tag + 4 × 4 token bytes = 156, padded to 64


def block(ident=B1, key=b""):
    payload = np.arange(128, dtype=np.float32).view(np.uint8)
    buf = np.zeros(HS + payload.nbytes, dtype=np.uint8)
    buf[HS:] = payload
    encode_block(memoryview(buf), ident, "float32", SHAPE, memoryview(buf[HS:]), key)
    return buf


def reason(buf, want=B1, key=b"", dtype="float32"):
    with pytest.raises(BlockVerifyError) as e:
        verify_block(memoryview(buf), want, dtype, SHAPE, key)
    return e.value.reason


def test_layout_by_hand():
    assert (FIXED.size, header_size(4), header_size(16), header_size(32)) == (124, HS, 256, 320)
    b = block()
    assert bytes(b[:4]) == b"WPKV" and struct.unpack_from("<HHH", b, 4) == (2, 1, 4)   # v2, float32, 4 tokens
    assert struct.unpack_from("<6IQ", b, 12) == (2, 2, 4, 1, 8, 0, 512)
    assert bytes(b[44:60]) == HASHES[1] and bytes(b[60:76]) == HASHES[0] and bytes(b[76:108]) == DIGESTS[1]
    assert bytes(b[108:124]) == xxhash.xxh3_128_digest(np.arange(128, dtype=np.float32).tobytes())
    assert bytes(b[124:140]) == hashlib.blake2b(bytes(b[:124]) + bytes(b[140:156]), digest_size=16).digest()
    assert struct.unpack_from("<4I", b, 140) == (21, 22, 23, 24) and not b[156:HS].any()
    verify_block(memoryview(b), B1, "float32", SHAPE)        # sound: no error
    assert B0.parent == NO_PARENT


def test_digest_chain_by_hand():
    d0 = hashlib.blake2b(NS.strong_digest + struct.pack("<4I", 11, 12, 13, 14), digest_size=32).digest()
    assert DIGESTS == [d0, hashlib.blake2b(d0 + struct.pack("<4I", 21, 22, 23, 24), digest_size=32).digest()]
    assert digest_prefix_blocks(NS, TOKENS, DIGESTS[:1]) == DIGESTS          # incremental
    other = digest_prefix_blocks(NS, [10] + TOKENS[1:])                      # one earlier token differs
    assert other[0] != DIGESTS[0] and other[1] != DIGESTS[1]
    assert digest_prefix_blocks(NS.with_salt("t2"), TOKENS)[0] != DIGESTS[0]  # another tenant


def test_one_flipped_payload_bit_is_a_checksum_failure():
    b = block()
    b[HS + 5] ^= 0x01
    assert reason(b) == "checksum" and "checksum" in BROKEN


def test_a_flipped_header_bit_fails_the_tag():
    b = block()
    b[140] ^= 0x01               # token 21 -> 20 in the stored header
    assert reason(b) == "tag"


def test_identity_mismatches_are_refused_but_not_broken():
    b = block()
    assert reason(b, BlockIdentity.of(HASHES[1], HASHES[0], DIGESTS[1], [21, 22, 23, 25])) == "tokens"
    assert reason(b, BlockIdentity.of(HASHES[1], b"p" * 16, DIGESTS[1], TOKENS[4:])) == "parent"
    assert reason(b, BlockIdentity.of(HASHES[1], HASHES[0], b"d" * 32, TOKENS[4:])) == "prefix"
    # a sound block of another prefix under the same key (a collision) is kept in its tier
    assert not {"tokens", "parent", "prefix"} & BROKEN


def test_a_block_stored_under_another_key_is_refused():
    assert reason(block(B0)) == "key"                        # block 0's bytes at block 1's key
    assert "key" in BROKEN


def test_keyed_tags_refuse_writers_without_the_secret():
    k = derive_key("cluster-token")
    assert len(k) == 32 and derive_key(None) == derive_key("") == b""
    b = block(key=k)
    verify_block(memoryview(b), B1, "float32", SHAPE, k)
    assert reason(b) == "tag"                                # read without the secret
    assert reason(b, key=derive_key("other")) == "tag"
    assert reason(block(), key=k) == "tag"                   # written without it
    # the payload checksum is seeded from the key: same bytes, another checksum
    p = np.arange(128, dtype=np.float32).view(np.uint8)
    assert payload_checksum(p, k) == xxhash.xxh3_128_digest(p, int.from_bytes(k[:8], "little"))
    assert payload_checksum(p, k) != payload_checksum(p)


def test_format_failures():
    b = block()
    assert reason(b[:HS - 1]) == "format"                    # truncated header
    assert reason(b[:-4]) == "format"                        # truncated payload
    assert reason(b, dtype="bfloat16") == "format"           # layout
    bad = block()
    bad[0] = 0
    assert reason(bad) == "format"                           # magic
    assert reason(block(), BlockIdentity.of(HASHES[1], HASHES[0], DIGESTS[1], TOKENS[3:])) == "format"

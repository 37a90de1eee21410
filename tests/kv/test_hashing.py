import struct
import subprocess
import sys

import pytest

from warmpath.kv.hashing import (NO_PARENT, KVNamespace, hash_block, hash_packed_blocks, hash_prefix_blocks,
                                 pack_tokens)

NS = KVNamespace("m", "r1", "float32", 4, tokenizer="t")


def test_only_full_blocks_are_hashed():
    assert len(hash_prefix_blocks(NS, list(range(11)))) == 2
    with pytest.raises(ValueError, match="only full blocks"):
        hash_block(NS, None, [1, 2, 3])


def test_chain_depends_on_parent_and_prefix():
    a = hash_prefix_blocks(NS, [1, 2, 3, 4, 5, 6, 7, 8])
    b = hash_prefix_blocks(NS, [9, 2, 3, 4, 5, 6, 7, 8])
    assert a[1] != b[1]  # same tokens in block 1, different parent
    assert len(a[0]) == 16
    assert hash_prefix_blocks(NS, [1, 2, 3, 4, 5, 6, 7, 8, 9], a[:1]) == a


@pytest.mark.parametrize("field,value", [("model_id", "m2"), ("revision", "r2"), ("dtype", "bfloat16"),
                                         ("tokenizer", "t2"), ("adapter", "lora1"), ("cache_salt", "tenant-b")])
def test_namespace_fields_change_every_hash(field, value):
    kw = dict(model_id="m", revision="r1", dtype="float32", block_size=4, tokenizer="t")
    kw[field] = value
    other = KVNamespace(**kw)
    toks = [1, 2, 3, 4]
    assert hash_block(other, None, toks) != hash_block(NS, None, toks)


def test_with_salt():
    assert NS.with_salt(None) is NS
    assert NS.with_salt("x").cache_salt == "x"
    assert NS.with_salt("x").digest != NS.digest


def test_hash_is_stable_across_processes():
    code = ("from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks;"
            "print(hash_prefix_blocks(KVNamespace('m','r1','float32',4,tokenizer='t'), [1,2,3,4,5,6,7,8])[1].hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"}).stdout.strip()
    assert out == hash_prefix_blocks(NS, [1, 2, 3, 4, 5, 6, 7, 8])[1].hex()


def test_bad_namespace():
    with pytest.raises(ValueError, match="block_size"):
        KVNamespace("m", "r", "float32", 0)


def test_no_torch_import():
    code = ("import sys, warmpath.kv.hashing, warmpath.kv.block_pool, warmpath.engine.scheduler,"
            " warmpath.engine.block_manager, warmpath.engine.detokenizer; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def reference_chain(ns, tokens):
    """The chain as defined: hash_block over every full block, one after the other."""
    out, bs = [], ns.block_size
    for i in range(len(tokens) // bs):
        out.append(hash_block(ns, out[-1] if out else None, tokens[i * bs:(i + 1) * bs]))
    return out


@pytest.mark.parametrize("bs", [1, 4, 16])
def test_fast_chain_equals_the_definition(bs):
    import random
    rng = random.Random(bs)
    ns = KVNamespace("m", "r", "float32", bs, cache_salt="s")
    for n in (0, bs - 1, bs, 5 * bs + 3, 300):
        toks = [rng.randrange(1 << 32) for _ in range(n)]
        ref = reference_chain(ns, toks)
        assert hash_prefix_blocks(ns, toks) == ref
        assert hash_packed_blocks(ns, pack_tokens(toks)) == ref
        k = len(ref) // 2
        assert hash_packed_blocks(ns, pack_tokens(toks[k * bs:]), ref[k - 1] if k else NO_PARENT) == ref[k:]
        assert hash_prefix_blocks(ns, toks, ref[:k]) == ref


def test_pack_tokens_is_little_endian_u32():
    assert pack_tokens([1, 258, (1 << 32) - 1]) == bytes([1, 0, 0, 0, 2, 1, 0, 0, 255, 255, 255, 255])
    assert pack_tokens(range(3)) == struct.pack("<3I", 0, 1, 2)
    for bad in ([-1], [1 << 32], [1.5]):
        with pytest.raises(struct.error):     # the error it always raised
            pack_tokens(bad)


def test_hashes_are_the_ones_published_before():
    # computed by the slice-and-concatenate loop this module had before hash_packed_blocks:
    # KV events, L2/L3 keys and stored blocks depend on these exact bytes
    assert [h.hex() for h in hash_prefix_blocks(NS, [1, 2, 3, 4, 5, 6, 7, 70000, 9, 10])] == [
        "d4498bb86682104c875333da9b3d4ca8", "c0e3a8e4e04c2be51c0af924a6e45545"]

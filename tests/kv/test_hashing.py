import subprocess
import sys

import pytest

from warmpath.kv.hashing import KVNamespace, hash_block, hash_prefix_blocks

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

"""The C block hash chain (``native/blockhash.c``, ``warmpath.kv._blockhash``) against the
Python one it replaces: the same keys bit for bit, the same packing, the same errors."""

import array
import json
import random
import struct
import subprocess
import sys

import numpy as np
import pytest

from warmpath.kv import hashing
from warmpath.kv.hash_cache import BlockHashCache, common_blocks
from warmpath.kv.hashing import NO_PARENT, KVNamespace, hash_block, pack_tokens

_chain_py, hash_packed_blocks = hashing._chain_py, hashing.hash_packed_blocks
hash_prefix_blocks, token_array = hashing.hash_prefix_blocks, hashing.token_array

NS = KVNamespace("m", "r1", "float32", 4, tokenizer="t")


def test_the_install_step_built_the_c_chain():
    # setup.py builds it (``pip install -e .``, ``make setup``); without it hashing is ~10x slower
    assert hashing.NATIVE, "warmpath.kv._blockhash is not built: run `pip install -e .` (needs a C compiler)"


# record lengths 32 + 4*bs cross every XXH3-128 length class: 17-128 (bs 1..24), 129-240
# (bs 25..52), and the long path (> 240) with one and several 1 KiB stripes
@pytest.mark.parametrize("bs", [1, 4, 16, 24, 25, 52, 53, 64, 256, 300])
def test_c_chain_equals_python_chain_and_the_definition(bs):
    rng = random.Random(bs)
    ns = KVNamespace("m", "r", "float32", bs, cache_salt="s")
    toks = [rng.randrange(1 << 32) for _ in range(7 * bs + bs // 2)]
    packed = pack_tokens(toks)
    want = _chain_py(ns, packed)
    assert len(want) == 7
    assert hash_packed_blocks(ns, packed) == want
    assert want[:3] == [hash_block(ns, None, toks[:bs]), hash_block(ns, want[0], toks[bs:2 * bs]),
                        hash_block(ns, want[1], toks[2 * bs:3 * bs])]
    parent = bytes(range(16))
    assert hash_packed_blocks(ns, packed[4 * bs:], parent) == _chain_py(ns, packed[4 * bs:], parent)
    assert hash_packed_blocks(ns, memoryview(packed)[8 * bs:], want[1]) == want[2:]      # any buffer
    assert hash_packed_blocks(ns, token_array(toks)) == want


def test_c_chain_rejects_bad_arguments():
    from warmpath.kv import _blockhash
    with pytest.raises(ValueError, match="16 bytes"):
        _blockhash.chain(NS.digest, b"short", b"\0" * 16, 4)
    with pytest.raises(ValueError, match="block_size"):
        _blockhash.chain(NS.digest, NO_PARENT, b"\0" * 16, 0)
    assert _blockhash.chain(NS.digest, NO_PARENT, b"\0" * 15, 4) == []       # no full block


def test_token_arrays_pack_as_lists_do():
    ids = [0, 1, 258, 70000, (1 << 32) - 1, True]
    want = struct.pack("<6I", *ids)
    assert pack_tokens(ids) == pack_tokens(tuple(ids)) == want
    arr = token_array(ids)
    assert arr.typecode == "I" and list(arr) == [0, 1, 258, 70000, (1 << 32) - 1, 1]
    assert token_array(arr) is arr and pack_tokens(arr) == want
    assert pack_tokens(np.array(ids, np.uint32)) == want
    assert pack_tokens(np.array(ids, np.int64)) == want           # other dtypes: id by id
    assert pack_tokens(range(3)) == struct.pack("<3I", 0, 1, 2)
    for bad in ([5, -1], [1 << 32], [1, 1.5], (2, "3")):
        with pytest.raises(struct.error):
            pack_tokens(bad)
        with pytest.raises(struct.error):
            token_array(bad)


def test_common_blocks_in_c_and_python_agree():
    from warmpath.kv import _blockhash
    rng = random.Random(3)
    base = pack_tokens([rng.randrange(1 << 20) for _ in range(64)])
    for cut in (0, 1, 3, 4, 5, 31, 32, 63):
        other = bytearray(base)
        other[4 * cut] ^= 1                                        # token ``cut`` differs
        for b in (bytes(other), base, base[:4 * cut + 4], b""):
            got = common_blocks(base, b, 4)
            assert got == _blockhash.common_blocks(b, base, 4)
            n = min(len(base), len(b)) // 16
            want = next((i for i in range(n) if base[16 * i:16 * i + 16] != b[16 * i:16 * i + 16]), n)
            assert got == want, (cut, len(b))


PY_ONLY = """
import json, sys
sys.modules["warmpath.kv._blockhash"] = None          # as if the C chain were not built
from warmpath.kv import hashing
from warmpath.kv.hash_cache import BlockHashCache
ns = hashing.KVNamespace("m", "r1", "float32", 4, tokenizer="t")
cache = BlockHashCache()
a = list(range(100, 140))
b = a[:21] + [7] * 30
out = {"native": hashing.NATIVE,
       "golden": [h.hex() for h in hashing.hash_prefix_blocks(ns, [1, 2, 3, 4, 5, 6, 7, 70000, 9, 10])],
       "a": [h.hex() for h in cache.hashes(ns, a, "s")], "b": [h.hex() for h in cache.hashes(ns, b, "s")],
       "reused": cache.reused_blocks}
print(json.dumps(out))
"""


def test_the_python_fallback_gives_the_same_keys():
    out = json.loads(subprocess.run([sys.executable, "-c", PY_ONLY], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["native"] is False
    assert out["golden"] == ["d4498bb86682104c875333da9b3d4ca8", "c0e3a8e4e04c2be51c0af924a6e45545"]
    cache = BlockHashCache()
    a = list(range(100, 140))
    b = a[:21] + [7] * 30
    assert out["a"] == [h.hex() for h in cache.hashes(NS, token_array(a), "s")]
    assert out["b"] == [h.hex() for h in cache.hashes(NS, token_array(b), "s")]
    assert out["reused"] == cache.reused_blocks == 5                # b shares a's first 5 blocks
    assert out["b"] == [h.hex() for h in hash_prefix_blocks(NS, b)]


def test_hashing_releases_nothing_shared_between_threads():
    import threading
    ns = KVNamespace("m", "r", "float32", 16)
    prompts = [array.array("I", np.random.default_rng(i).integers(0, 50000, 16 * 500).astype(np.uint32).tobytes())
               for i in range(4)]
    want = [_chain_py(ns, p.tobytes()) for p in prompts]
    got = [None] * 4

    def run(i):
        for _ in range(20):
            got[i] = hash_packed_blocks(ns, prompts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_keyset_is_a_set_of_16_byte_keys():
    from warmpath.kv._blockhash import KeySet
    rng = random.Random(5)
    keys = [rng.randbytes(16) for _ in range(5000)]
    s, ref = KeySet(), set()
    for i in range(0, 5000, 700):                       # batches with repeats, grown past many rehashes
        batch = keys[max(0, i - 300):i + 700]
        s.update(tuple(batch))
        ref.update(batch)
        assert len(s) == len(ref)
    s.add(keys[0])
    assert set(s) == ref and all(k in s for k in keys)
    assert rng.randbytes(16) not in s and b"short" not in s and 7 not in s
    with pytest.raises(TypeError, match="16-byte"):
        s.update([b"short"])
    with pytest.raises(TypeError, match="16-byte"):
        s.add("0123456789abcdef")
    s.clear()
    assert len(s) == 0 and keys[0] not in s and list(s) == []
    s.update(iter(keys[:3]))                            # any iterable
    assert set(s) == set(keys[:3])
    assert hashing.KeySet is KeySet


def test_c_chain_as_a_tuple():
    from warmpath.kv import _blockhash
    packed = pack_tokens(list(range(40)))
    want = _chain_py(NS, packed)
    got = _blockhash.chain(NS.digest, NO_PARENT, packed, 4, True)
    assert type(got) is tuple and list(got) == want
    assert _blockhash.chain(NS.digest, NO_PARENT, packed, 4, False) == want

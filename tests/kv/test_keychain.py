"""A chain's keys in one buffer (``kv/keychain.py``, ``_blockhash.chain_keys``): the same keys
as ``hash_prefix_blocks`` bit for bit (C and the Python fallback), and the same leading runs
as the tuple path when the index's C lookups read the buffer (``native/keyruns.c``)."""

import json
import random
import subprocess
import sys

import pytest

from warmpath.kv import hashing
from warmpath.kv.hash_cache import BlockHashCache
from warmpath.kv.hashing import NO_PARENT, KVNamespace, hash_packed_keys, hash_prefix_blocks, pack_tokens
from warmpath.kv.keychain import KeyChain
from warmpath.kv.keyruns import certify, closed_run, run

NS = KVNamespace("m", "r1", "float32", 4, tokenizer="t")
K = tuple(bytes([i]) * 16 for i in range(6))
native = pytest.mark.skipif(not hashing.NATIVE, reason="warmpath.kv._blockhash not built")


def test_a_chain_is_a_sequence_of_its_keys():
    c = KeyChain.of(K)
    assert len(c) == 6 and c.buf == b"".join(K) and c.keys() == K and tuple(c) == K
    assert c[0] == K[0] and c[5] == c[-1] == K[5] and c[-6] == K[0]
    assert c[1:3] == KeyChain.of(K[1:3]) and type(c[1:3]) is KeyChain and len(c[4:2]) == 0
    assert c[::2] == K[::2] and c[::-1] == K[::-1]
    assert c == K and K == c and c == list(K) and c != K[:5] and c != K[:5] + (b"x" * 16,)
    assert hash(c) == hash(K) and K[3] in c and b"\x09" * 16 not in c and c.index(K[2]) == 2
    assert KeyChain() == () and not KeyChain() and repr(c) == "KeyChain(6 keys)"
    for bad in (6, -7):
        with pytest.raises(IndexError):
            c[bad]
    with pytest.raises(ValueError, match="whole 16-byte"):
        KeyChain(b"x" * 17)
    with pytest.raises(ValueError, match="16-byte"):
        KeyChain.of([b"short"])


@pytest.mark.parametrize("bs", [1, 4, 16, 25, 64, 300])
def test_chain_keys_are_the_chain_back_to_back(bs):
    rng = random.Random(bs)
    ns = KVNamespace("m", "r", "float32", bs, cache_salt="s")
    toks = [rng.randrange(1 << 32) for _ in range(9 * bs + bs // 2)]
    packed, want = pack_tokens(toks), hash_prefix_blocks(ns, toks)
    assert len(want) == 9
    assert hash_packed_keys(ns, packed) == b"".join(want)
    assert hash_packed_keys(ns, packed[16 * bs:], want[3], b"".join(want[:4])) == b"".join(want)
    assert hash_packed_keys(ns, memoryview(packed)[4 * bs:], want[0], memoryview(b"".join(want))[:16]) == b"".join(want)
    assert hashing._chain_py(ns, packed) == want


@native
def test_c_chain_keys_and_split_check_their_arguments():
    b = hashing._blockhash
    assert b.chain_keys(NS.digest, NO_PARENT, b"\0" * 15, 4) == b""
    assert b.chain_keys(NS.digest, NO_PARENT, b"", 4, K[0]) == K[0]
    with pytest.raises(ValueError, match="whole 16-byte"):
        b.chain_keys(NS.digest, NO_PARENT, b"\0" * 16, 4, b"x" * 15)
    with pytest.raises(ValueError, match="16 bytes"):
        b.chain_keys(NS.digest, b"short", b"\0" * 16, 4)
    with pytest.raises(ValueError, match="block_size"):
        b.chain_keys(NS.digest, NO_PARENT, b"\0" * 16, 0)
    assert b.split(b"".join(K)) == K and b.split(b"") == ()
    with pytest.raises(ValueError, match="whole 16-byte"):
        b.split(b"x" * 20)


def test_the_cache_gives_chains_equal_to_fresh_hashing():
    rng = random.Random(7)
    cache, prompt = BlockHashCache(), [rng.randrange(1 << 20) for _ in range(30)]
    for _ in range(40):
        prompt = prompt[:rng.randrange(len(prompt) + 1)] + [rng.randrange(1 << 20) for _ in range(rng.randrange(1, 40))]
        got = cache.hashes(NS, prompt, "s")
        assert type(got) is KeyChain and got.keys() == tuple(hash_prefix_blocks(NS, prompt))
    assert cache.reused_blocks > 0


def c_set(keys=()):
    s = hashing._blockhash.KeySet()
    s.update(list(keys))
    return s


KINDS = {"set": set, "keyset": pytest.param(c_set, marks=native)}


@pytest.mark.parametrize("make", KINDS.values(), ids=KINDS.keys())
def test_runs_over_a_chain_buffer_equal_runs_over_the_tuple(make):
    rng = random.Random(1)
    pool = [rng.randbytes(16) for _ in range(300)]
    for trial in range(60):
        chain = tuple(pool[:rng.randrange(1, 300)])
        kc = KeyChain.of(chain)
        held = make(rng.sample(pool, rng.randrange(300)) + list(chain[:rng.randrange(len(chain) + 1)]))
        for start in (0, 1, len(chain) // 2, len(chain), len(chain) + 3):
            assert run(held, kc, start) == run(held, chain, start), (trial, start)
        closed = make(chain[:rng.randrange(len(chain) + 1)])
        assert closed_run(closed, kc) == closed_run(closed, chain)
        cert_t, cert_b = make(), make()
        v = rng.randrange(len(chain) + 1)
        assert certify(cert_b, held, kc, v) == certify(cert_t, held, chain, v)
        assert set(cert_b) == set(cert_t), trial


@native
def test_c_lookups_take_a_buffer_of_whole_keys_only():
    s = c_set(K[:3])
    assert s.run(b"".join(K)) == 3 and s.run(bytearray(b"".join(K)), 4) == 4 and s.run(b"") == 0
    assert s.closed_run(memoryview(b"".join(K))) == 3 and c_set().certify(s, b"".join(K), 1) == 3
    for call in (lambda: s.run(b"x" * 17), lambda: s.closed_run(b"x" * 8), lambda: c_set().certify(s, b"x" * 40, 0)):
        with pytest.raises(ValueError, match="whole 16-byte"):
            call()
    with pytest.raises(TypeError, match="buffer"):
        s.run(iter(K))


PY_ONLY = """
import json, sys
sys.modules["warmpath.kv._blockhash"] = None          # as if the C extension were not built
from warmpath.kv import hashing
from warmpath.kv.hash_cache import BlockHashCache
from warmpath.kv.keyruns import certify, closed_run, run
ns = hashing.KVNamespace("m", "r1", "float32", 4, tokenizer="t")
cache = BlockHashCache()
a = list(range(300, 400))
b = a[:37] + [5] * 60
ca, cb = cache.hashes(ns, a, "s"), cache.hashes(ns, b, "s")
held = set(ca.keys()[:20])
cert = set()
print(json.dumps({"native": hashing.NATIVE, "a": ca.buf.hex(), "b": cb.buf.hex(), "reused": cache.reused_blocks,
                  "runs": [run(held, cb), closed_run(held, ca), certify(cert, held, ca, 0), len(cert)]}))
"""


def test_the_python_fallback_gives_the_same_chains_and_runs():
    out = json.loads(subprocess.run([sys.executable, "-c", PY_ONLY], capture_output=True, text=True,
                                    check=True).stdout)
    a = list(range(300, 400))
    b = a[:37] + [5] * 60
    assert out["native"] is False and out["reused"] == 9                 # b shares a's first 9 blocks
    assert out["a"] == b"".join(hash_prefix_blocks(NS, a)).hex()
    assert out["b"] == b"".join(hash_prefix_blocks(NS, b)).hex()
    assert out["runs"] == [9, 20, 20, 20]                                # b leaves a at block 9

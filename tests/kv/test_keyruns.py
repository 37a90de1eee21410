"""Leading runs of a chain in a set (``kv/keyruns.py``, ``native/keyruns.c``): hand-worked
runs for every kind of set a lookup probes (C ``KeySet``, Python ``set`` and ``dict``: the
path without the extension), and ``KeySet.discard`` / ``absorb`` against Python's set."""

import random

import pytest

from warmpath.kv import hashing
from warmpath.kv.keyruns import certify, closed_run, run

K = tuple(bytes([i]) * 16 for i in range(6))
HELD = (K[0], K[1], K[2], K[4])                   # a gap at block 3
native = pytest.mark.skipif(not hashing.NATIVE, reason="warmpath.kv._blockhash not built")


def c_set(keys=()):
    s = hashing._blockhash.KeySet()
    s.update(list(keys))
    return s


KINDS = {"set": set, "dict": lambda ks: {k: {"L1"} for k in ks},
         "keyset": pytest.param(c_set, marks=native)}


@pytest.mark.parametrize("make", KINDS.values(), ids=KINDS.keys())
def test_run_stops_at_the_first_missing_block(make):
    held = make(HELD)
    assert [run(held, K, s) for s in range(8)] == [3, 3, 3, 3, 5, 5, 6, 7]
    assert run(held, list(K)) == 3 and run(held, K[3:]) == 0 and run(held, K[4:]) == 1 and run(held, ()) == 0
    assert run(make(()), K) == 0 and run(make(K), K) == 6
    assert run(held, (K[0], b"short", K[1])) == 1               # not a 16-byte key: in no set
    with pytest.raises(ValueError, match="start"):
        run(held, K, -1)


@pytest.mark.parametrize("make", KINDS.values(), ids=KINDS.keys())
def test_closed_run_is_a_binary_search(make):
    assert [closed_run(make(K[:m]), K) for m in range(7)] == [0, 1, 2, 3, 4, 5, 6]
    assert closed_run(make(K), K[:0]) == 0
    # a set that is not prefix-closed: the search probes 3 (absent), then 1 (held), then 2 (held)
    assert closed_run(make((K[1], K[2], K[5])), K) == 3


@pytest.mark.parametrize("make", KINDS.values(), ids=KINDS.keys())
def test_certify_adds_the_run_it_passed(make):
    cert = make(()) if make is not KINDS["dict"] else set()
    held = make(HELD)
    assert certify(cert, held, K, 0) == 3 and set(cert) == set(K[:3])
    assert certify(cert, held, K, 3) == 3 and set(cert) == set(K[:3])     # block 3 missing: nothing added
    assert certify(cert, held, K, 4) == 5 and set(cert) == {K[0], K[1], K[2], K[4]}
    assert certify(cert, held, K, 9) == 9 and len(cert) == 4


@native
def test_c_certify_into_a_python_set_takes_the_python_path():
    cert = set()
    assert certify(cert, c_set(HELD), K, 0) == 3 and cert == set(K[:3])
    assert certify(c_set(), dict.fromkeys(HELD), K, 4) == 5


@native
def test_c_calls_check_their_arguments():
    s = c_set(HELD)
    with pytest.raises(TypeError, match="tuple or a list"):
        s.run(iter(K))
    with pytest.raises(TypeError):
        s.certify(set(HELD), K, 0)                              # held must be a KeySet
    with pytest.raises(ValueError, match="start"):
        s.certify(c_set(), K, -2)
    assert run(s, K[:4]) == 3 and s.run(list(K), 4) == 5


@native
def test_discard_keeps_every_probe_chain():
    rng = random.Random(11)
    pool = [rng.randbytes(16) for _ in range(3000)]
    s, ref = c_set(), set()
    for step in range(40):
        add = rng.sample(pool, 150)
        s.absorb(add)
        ref.update(add)
        gone = rng.sample(pool, 120)
        for k in gone:
            s.discard(k)
            ref.discard(k)
        assert len(s) == len(ref), step
        assert [k in s for k in pool] == [k in ref for k in pool], step
    assert set(s) == ref
    s.discard(b"short")
    s.discard(7)
    assert len(s) == len(ref)
    half = list(ref)[: len(ref) // 2]
    s.discard_all(half + [b"short", 7])                         # a batch; non-keys skipped
    ref.difference_update(half)
    assert len(s) == len(ref) and set(s) == ref
    s.discard_all(iter(list(ref)))
    assert len(s) == 0 and list(s) == [] and not any(k in s for k in pool)


@native
def test_discard_in_a_small_table_wraps_around():
    rng = random.Random(3)
    for trial in range(500):                  # 7 keys in 16 slots: long chains, wrapping past the end
        keys = [rng.randbytes(16) for _ in range(7)]
        s = c_set(keys)
        left = set(keys)
        for k in rng.sample(keys, 7):
            s.discard(k)
            left.discard(k)
            assert all((x in s) == (x in left) for x in keys), trial
        assert len(s) == 0


@native
def test_absorb_skips_what_is_no_block_key():
    s = c_set()
    s.absorb([K[0], b"short", 7, K[1], K[0], "0123456789abcdef"])
    assert len(s) == 2 and set(s) == {K[0], K[1]}

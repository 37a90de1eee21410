"""The index's C mirrors of its held sets (``held_keys``, ``l3_keys``: what lookups probe
with the extension) stay equal to ``local`` and ``l3``; and the index without the extension
(Python sets, ``kv/keyruns.py``'s Python path) passes the index tests unchanged."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from warmpath.kv import hashing
from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.views import PrefixHit

H = tuple(bytes([i]) * 16 for i in range(6))
ROOT = Path(__file__).resolve().parents[2]
native = pytest.mark.skipif(not hashing.NATIVE, reason="warmpath.kv._blockhash not built")


def stored(hs, medium):
    return BlockStored(list(hs), None, [], 16, medium)


def keys(held) -> set:
    """The block keys among ``held`` (what a mirror keeps: a request's chain has no other)."""
    return {k for k in held if isinstance(k, bytes) and len(k) == 16}


def mirrors_match(idx: GlobalKVIndex) -> None:
    assert set(idx.l3_keys) == keys(idx.l3)
    assert idx.held_keys.keys() <= idx.local.keys()
    for w, held in idx.local.items():
        assert set(idx.held_keys.get(w, ())) == keys(held), w


@native
def test_a_block_leaves_the_mirror_with_its_last_tier():
    idx = GlobalKVIndex()
    idx.apply("w", [stored(H[:3], "L1"), stored(H[1:2], "L2"), stored(H[2:5], "L3")], 0)
    assert set(idx.held_keys["w"]) == set(H[:3]) and set(idx.l3_keys) == set(H[2:5])
    idx.apply("w", [BlockRemoved([H[1]], "L1")], 1)               # still in L2
    assert set(idx.held_keys["w"]) == set(H[:3])
    assert idx.lookup("w", H, 1) == PrefixHit(3, 2)
    idx.apply("w", [BlockRemoved([H[1]], "L2"), BlockRemoved([H[3]], "L3")], 2)
    assert set(idx.held_keys["w"]) == {H[0], H[2]} and set(idx.l3_keys) == {H[2], H[4]}
    assert idx.lookup("w", H, 2) == PrefixHit(1, 0)
    idx.apply("w", [stored([b"not a key", 7], "L1"), stored([b"x"], "L3")], 3)   # kept, never matched
    assert b"not a key" in idx.local["w"] and len(idx.held_keys["w"]) == 2 and len(idx.l3_keys) == 2
    mirrors_match(idx)
    idx.apply("w", [AllBlocksCleared()], 4)
    assert len(idx.held_keys["w"]) == 0
    idx.drop_worker("w")
    assert "w" not in idx.held_keys
    assert idx.lookup("w", H, 5) == PrefixHit(0, 0) and idx.lookup("w", H[2:], 5) == PrefixHit(0, 1)
    mirrors_match(idx)


@native
def test_mirrors_follow_random_histories():
    rng = random.Random(5)
    keys = [rng.randbytes(16) for _ in range(60)]
    idx = GlobalKVIndex()
    for step in range(2000):
        w, medium = rng.choice(["a", "b", "c"]), rng.choice(["L1", "L2", "L3"])
        op = rng.random()
        if op < 0.5:
            idx.apply(w, [stored(rng.sample(keys, rng.randrange(1, 8)), medium)], step)
        elif op < 0.95:
            idx.apply(w, [BlockRemoved(rng.sample(keys, rng.randrange(1, 8)), medium)], step)
        elif op < 0.98:
            idx.apply(w, [AllBlocksCleared()], step)
        else:
            idx.drop_worker(w)
        mirrors_match(idx)


PY_ONLY = """
import sys
sys.modules["warmpath.kv._blockhash"] = None          # as if the extension were not built
import pytest
from warmpath.routing import index
assert not index.NATIVE and index.KeySet is set
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/routing/test_index.py",
                      "tests/routing/test_index_exact.py", "tests/kv/test_keyruns.py"]))
"""


def test_the_index_without_the_extension_passes_the_index_tests():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", PY_ONLY], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert " passed" in out.stdout and " failed" not in out.stdout

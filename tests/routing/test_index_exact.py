"""The binary-search lookup of ``GlobalKVIndex`` against the block-by-block lookup it
replaced, on real hash chains with gaps, evictions in the middle, L3 holes and stale workers."""

import random

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.views import PrefixHit

NS = KVNamespace("m", "r", "float32", 4)
C = tuple(hash_prefix_blocks(NS, list(range(32))))          # 8 blocks


def stored(hs, medium="L1"):
    return BlockStored(list(hs), None, [], 4, medium)


def reference(idx: GlobalKVIndex, worker: str, hashes, now: float) -> PrefixHit:
    """The lookup before binary search, verbatim: every block in turn."""
    held = idx.local.get(worker, {})
    approx = idx.approx.get(worker, {}) if idx.is_stale(worker, now) else {}
    n = 0
    for h in hashes:
        if h in held or approx.get(h, float("-inf")) >= now:
            n += 1
        else:
            break
    m = 0
    for h in hashes[n:]:
        if h not in idx.l3:
            break
        m += 1
    return PrefixHit(n, m)


def naive_binary_search(idx: GlobalKVIndex, worker: str, hashes) -> int:
    """A binary search over "held" alone: wrong wherever a chain has a gap."""
    held, lo, hi = idx.local.get(worker, {}), 0, len(hashes)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if hashes[mid] in held else (lo, mid)
    return lo


def test_eviction_in_the_middle_ends_the_hit():
    idx = GlobalKVIndex()
    idx.apply("w", [stored(C)], 0)
    assert idx.lookup("w", C, 0) == PrefixHit(8, 0)
    assert set(idx.certified["w"]) == set(C)
    idx.apply("w", [BlockRemoved([C[3]], "L1")], 1)     # blocks 4..7 still held
    assert set(idx.certified["w"]) == set()             # a certified block went: start again
    # a binary search over "held" would probe blocks 4, 6, 7 (all held) and answer 8
    assert idx.lookup("w", C, 1) == PrefixHit(3, 0)
    assert set(idx.certified["w"]) == set(C[:3])


def test_removing_an_uncertified_block_keeps_the_certificate():
    idx = GlobalKVIndex()
    other = tuple(hash_prefix_blocks(NS, [9] * 8))
    idx.apply("w", [stored(C[:4]), stored(other)], 0)
    assert idx.lookup("w", C, 0) == PrefixHit(4, 0)
    idx.apply("w", [BlockRemoved([other[1]], "L1"), BlockRemoved([C[2]], "L2")], 1)   # C[2]: not in L2
    assert set(idx.certified["w"]) == set(C[:4])
    assert idx.lookup("w", C, 1) == PrefixHit(4, 0)


def test_block_held_without_its_parent():
    idx = GlobalKVIndex()
    idx.apply("w", [stored(C[1:])], 0)
    assert idx.lookup("w", C, 0) == PrefixHit(0, 0)
    idx.apply("w", [stored(C[:1], "L2")], 1)
    assert idx.lookup("w", C, 1) == PrefixHit(8, 0)


def test_l3_holes():
    idx = GlobalKVIndex()
    idx.apply("a", [stored(C[:3]), stored(C[:2] + C[4:], "L3")], 0)
    idx.apply("b", [stored(C[:5])], 0)
    assert idx.lookup("a", C, 0) == PrefixHit(3, 0)     # block 3 in no tier
    assert idx.lookup("x", C, 0) == PrefixHit(0, 2)     # an unknown worker: L3 only
    assert set(idx.l3_certified) == set(C[:2])
    assert idx.lookup("b", C, 0) == PrefixHit(5, 3)     # L3 from block 5, past its hole
    idx.apply("a", [BlockRemoved([C[0]], "L3")], 1)
    assert set(idx.l3_certified) == set()
    assert idx.lookup("x", C, 1) == PrefixHit(0, 0)


def test_stale_worker_adds_routed_hints_after_the_certified_run():
    idx = GlobalKVIndex(stale_after_s=10, ttl_s=100)
    idx.apply("w", [stored(C[:2])], 0)
    assert idx.lookup("w", C, 0) == PrefixHit(2, 0)
    idx.note_routed("w", C[:6], 0)
    assert idx.lookup("w", C, 50) == PrefixHit(6, 0)    # stale: 2 certified, 4 assumed
    assert set(idx.certified["w"]) == set(C[:2])        # hints are never certified
    assert idx.lookup("w", C, 101) == PrefixHit(2, 0)   # hints past their TTL


def test_cleared_and_dropped_workers_lose_their_certificate():
    idx = GlobalKVIndex()
    idx.apply("w", [stored(C)], 0)
    idx.lookup("w", C, 0)
    idx.apply("w", [AllBlocksCleared()], 1)
    assert "w" not in idx.certified and idx.lookup("w", C, 1) == PrefixHit(0, 0)
    idx.apply("w", [stored(C[:2])], 2)
    idx.lookup("w", C, 2)
    idx.drop_worker("w")
    assert "w" not in idx.certified


def test_random_histories_match_the_block_by_block_lookup():
    rng = random.Random(7)
    # a tree of prompts: shared prefixes, branches at random block boundaries and mid-block
    prompts = [[rng.randrange(5) for _ in range(40)]]
    for _ in range(12):
        base = rng.choice(prompts)
        cut = rng.randrange(len(base) + 1)
        prompts.append(base[:cut] + [rng.randrange(5) for _ in range(rng.randrange(1, 30))])
    chains = [tuple(hash_prefix_blocks(NS, p)) for p in prompts]
    every = sorted({h for c in chains for h in c})
    workers = ["w0", "w1", "w2"]
    idx, now, checked = GlobalKVIndex(stale_after_s=5, ttl_s=8, max_approx_blocks=12), 0.0, 0
    hits = gaps = 0
    for _ in range(3000):
        now += rng.choice([0.0, 0.5, 3.0])
        w, op = rng.choice(workers), rng.random()
        if op < 0.35:        # a chain prefix (or a random set) stored in some tier
            c = rng.choice(chains)
            hs = c[:rng.randrange(len(c) + 1)] if rng.random() < 0.7 else rng.sample(every, 5)
            idx.apply(w, [stored(hs, rng.choice(["L1", "L2", "L3"]))], now)
        elif op < 0.6:       # single blocks removed, middle ones included
            idx.apply(w, [BlockRemoved(rng.sample(every, 3), rng.choice(["L1", "L2", "L3"]))], now)
        elif op < 0.63:
            idx.apply(w, [AllBlocksCleared()], now)
        elif op < 0.7:
            idx.note_routed(w, rng.choice(chains), now)
        elif op < 0.72:
            idx.drop_worker(w)
        for c in rng.sample(chains, 3):
            for x in workers + ["nobody"]:
                ref = reference(idx, x, c, now)
                gaps += naive_binary_search(idx, x, c) != ref.local_blocks and not idx.is_stale(x, now)
                assert idx.lookup(x, c, now) == ref
                checked, hits = checked + 1, hits + (ref.local_blocks > 0 and ref.l3_blocks > 0)
        for x, cert in idx.certified.items():
            assert set(cert) <= idx.local[x].keys()
        assert set(idx.l3_certified) <= idx.l3
    assert checked == 3000 * 3 * 4
    assert hits > 1000 and gaps > 100      # the histories do have both hits and gaps

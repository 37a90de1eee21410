import pytest
from hypothesis import given, settings, strategies as st

from warmpath.kv.block_pool import BlockPool


def h(i: int) -> bytes:
    return i.to_bytes(16, "little")


def test_allocate_exact_ids_and_refcounts():
    pool = BlockPool(4)
    a = pool.allocate(2)
    assert [b.block_id for b in a] == [0, 1]
    assert [b.ref_cnt for b in a] == [1, 1]
    assert pool.num_free == 2 and pool.usage == 0.5
    with pytest.raises(MemoryError):
        pool.allocate(3)
    assert pool.num_free == 2  # nothing changed on failure
    pool.check_integrity()


def test_cached_blocks_survive_free_and_are_evicted_lru():
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    for blk, i in ((a, 1), (b, 2), (c, 3)):
        pool.seal(blk, h(i), (i,))
    pool.free([c, a, b])  # free order = eviction order
    assert pool.num_free == 3 and pool.num_cached == 3
    hit = pool.lookup(h(1), (1,))
    assert hit is a
    pool.touch([hit])
    assert a.ref_cnt == 1 and pool.num_free == 2
    new = pool.allocate(1)
    assert new[0] is c  # least recently freed cached block goes first
    assert pool.lookup(h(3), (3,)) is None
    assert pool.stats.evictions == 1
    pool.check_integrity()


def test_uncached_blocks_are_reused_before_cached_ones():
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    pool.seal(a, h(1), (1,))
    pool.free([a])
    pool.free([b])
    assert pool.allocate(1)[0] is b
    assert pool.allocate(1)[0] is a


def test_collision_guard_compares_tokens():
    pool = BlockPool(2)
    (a,) = pool.allocate(1)
    pool.seal(a, h(7), (1, 2))
    assert pool.lookup(h(7), (1, 3)) is None
    assert pool.stats.collisions == 1
    assert pool.lookup(h(7), (1, 2)) is a


def test_duplicate_seal_keeps_first_block():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.seal(a, h(1), (1,))
    pool.seal(b, h(1), (1,))
    assert a.block_hash == h(1) and b.block_hash is None
    pool.check_integrity()


def test_double_free_raises():
    pool = BlockPool(1)
    (a,) = pool.allocate(1)
    pool.free([a])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([a])


def test_evict_hook_and_reset():
    pool = BlockPool(2)
    seen = []
    pool.add_evict_hook(lambda b: seen.append(b.block_hash))
    a, b = pool.allocate(2)
    pool.seal(a, h(1), (1,))
    pool.free([a, b])
    assert pool.evict_cached() == 1
    assert seen == [h(1)] and pool.num_cached == 0


ops = st.lists(st.tuples(st.sampled_from(["alloc", "free", "seal", "hit"]), st.integers(0, 50)),
               max_size=200)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_operations_keep_integrity(seq):
    pool = BlockPool(8)
    held = []  # one entry per reference
    for op, x in seq:
        if op == "alloc" and pool.num_free:
            held.extend(pool.allocate(1 + x % pool.num_free))
        elif op == "free" and held:
            pool.free([held.pop(x % len(held))])
        elif op == "seal" and held:
            blk = held[x % len(held)]
            pool.seal(blk, h(x % 5), (x % 5,))
        elif op == "hit":
            blk = pool.lookup(h(x % 5), (x % 5,))
            if blk is not None:
                pool.touch([blk])
                held.append(blk)
        pool.check_integrity()
    assert sum(b.ref_cnt for b in pool.blocks) == len(held)
    pool.free(held)
    assert pool.num_free == 8
    pool.check_integrity()

from warmpath.engine.block_manager import BlockManager
from warmpath.kv.block_pool import BlockPool

from tests.engine.helpers import make_seq


def make(n=8):
    pool = BlockPool(n)
    return pool, BlockManager(pool, 4)


def test_allocate_and_seal_exact_ids():
    pool, bm = make()
    s = make_seq("a", 10)
    assert bm.allocate_slots(s, 10)
    assert s.block_ids == [0, 1, 2]
    s.num_computed_tokens = 10
    sealed = bm.seal_full_blocks(s)
    assert [b.block_id for b in sealed] == [0, 1] and s.num_sealed_blocks == 2
    assert pool.blocks[2].block_hash is None
    pool.check_integrity()


def test_prefix_hit_shares_blocks_and_caps_at_len_minus_one():
    pool, bm = make()
    a = make_seq("a", 8)
    bm.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    bm.seal_full_blocks(a)
    b = make_seq("b", 8)  # identical prompt: only the first block may be reused
    hit = bm.match_prefix(b)
    assert [x.block_id for x in hit] == [0]
    assert bm.allocate_slots(b, 4, hit)
    assert b.block_ids == [0, 2] and b.num_computed_tokens == 4
    assert pool.blocks[0].ref_cnt == 2
    c = make_seq("c", 9)
    assert [x.block_id for x in bm.match_prefix(c)] == [0, 1]


def test_salt_isolates_tenants():
    pool, bm = make()
    a = make_seq("a", 9, salt="t1")
    bm.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    bm.seal_full_blocks(a)
    assert bm.match_prefix(make_seq("b", 9, salt="t2")) == []
    assert len(bm.match_prefix(make_seq("c", 9, salt="t1"))) == 2


def test_allocation_failure_changes_nothing():
    pool, bm = make(2)
    s = make_seq("a", 12)
    assert not bm.can_allocate(s, 12)
    assert not bm.allocate_slots(s, 12)
    assert s.block_ids == [] and pool.num_free == 2


def test_free_releases_tail_first():
    pool, bm = make(4)
    s = make_seq("a", 12)
    bm.allocate_slots(s, 12)
    s.num_computed_tokens = 12
    bm.seal_full_blocks(s)
    bm.free(s)
    assert pool.num_free == 4 and s.block_ids == []
    # block 2 (the tail) is evicted first
    assert pool.allocate(1)[0].block_id == 3
    assert pool.allocate(1)[0].block_id == 2
    pool.check_integrity()

import pytest

from warmpath.kv.lru_index import LRUSlotIndex


def h(i):
    return bytes([i]) * 16


def test_insert_get_evict_exact_slots():
    idx = LRUSlotIndex(2)
    assert idx.insert(h(1)) == (0, None)
    assert idx.insert(h(2)) == (1, None)
    assert idx.get(h(1)) == 0          # h(1) becomes most recent
    assert idx.oldest() == (h(2), 1)
    assert idx.insert(h(3)) == (1, h(2))
    assert h(2) not in idx and idx.evictions == 1
    assert idx.insert(h(3)) is None    # present: no new slot
    assert (idx.hits, idx.misses) == (1, 0)
    idx.check_integrity()


def test_remove_and_clear():
    idx = LRUSlotIndex(3)
    for i in range(3):
        idx.insert(h(i))
    assert idx.remove(h(1)) and not idx.remove(h(1))
    assert idx.oldest() is None        # a free slot: nothing would be evicted
    assert idx.insert(h(9)) == (1, None)
    assert sorted(idx.clear()) == sorted([h(0), h(2), h(9)])
    assert len(idx) == 0
    idx.check_integrity()


def test_zero_capacity_and_validation():
    assert LRUSlotIndex(0).insert(h(1)) is None
    with pytest.raises(ValueError):
        LRUSlotIndex(-1)


def test_count_prefix_stops_at_the_first_miss_without_touching():
    from warmpath.kv.lru_index import LRUSlotIndex

    idx = LRUSlotIndex(3)
    for h in (b"a", b"b", b"c"):
        idx.insert(h)
    assert idx.count_prefix([b"a", b"b", b"x", b"c"]) == 2
    assert idx.count_prefix([b"x", b"a"]) == 0 and idx.count_prefix([]) == 0
    assert idx.insert(b"d")[1] == b"a"    # count_prefix did not refresh a: still the LRU victim

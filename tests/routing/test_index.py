from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.views import PrefixHit

H = tuple(bytes([i]) * 16 for i in range(6))


def stored(hs, medium):
    return BlockStored(list(hs), None, [], 16, medium)


def test_exact_index_from_events():
    idx = GlobalKVIndex()
    idx.apply("w1", [stored(H[:3], "L1"), stored(H[3:4], "L2"), stored(H[:5], "L3")], now=0)
    assert idx.lookup("w1", H, now=1) == PrefixHit(4, 1)
    assert idx.lookup("w2", H, now=1) == PrefixHit(0, 5)
    idx.apply("w1", [BlockRemoved([H[1]], "L1")], now=2)
    assert idx.lookup("w1", H, now=2) == PrefixHit(1, 4)
    idx.apply("w1", [BlockRemoved([H[0]], "L3")], now=3)
    assert idx.lookup("w2", H, now=3) == PrefixHit(0, 0)
    idx.apply("w1", [AllBlocksCleared()], now=4)
    assert idx.lookup("w1", H, now=4).local_blocks == 0


def test_demotion_keeps_block_local():
    idx = GlobalKVIndex()
    idx.apply("w", [stored(H[:2], "L1")], 0)
    idx.apply("w", [BlockRemoved([H[0]], "L1"), stored(H[:1], "L2")], 1)
    assert idx.lookup("w", H, 1).local_blocks == 2


def test_ttl_fallback_only_when_events_are_stale():
    idx = GlobalKVIndex(stale_after_s=10, ttl_s=100)
    idx.apply("w", [], now=0)
    idx.note_routed("w", H[:3], now=0)
    assert idx.lookup("w", H, now=5).local_blocks == 0     # events fresh: exact index only
    assert idx.lookup("w", H, now=50).local_blocks == 3    # stale: routed blocks assumed
    assert idx.lookup("w", H, now=101).local_blocks == 0   # TTL over
    idx.drop_worker("w")
    assert idx.lookup("w", H, now=50).local_blocks == 0


def test_a_worker_never_heard_from_holds_nothing_at_any_clock():
    """The simulator's clock can be negative (sessions before t=0): a block nobody routed or
    stored is not assumed held then either."""
    idx = GlobalKVIndex()
    for now in (-60.0, -1.0, 0.0, 5.0):
        assert idx.lookup("w", H, now=now) == PrefixHit(0, 0)
    idx.note_routed("w", H[:2], now=-60.0)
    assert idx.lookup("w", H, now=-30.0).local_blocks == 2

"""The router's tables stay bounded (hand-worked LRU cases)."""

from warmpath.kv.events import BlockStored
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.sessions import SessionTable


def test_session_table_forgets_the_least_recently_seen():
    t = SessionTable(idle_s=100, max_sessions=2)
    t.touch("a", 0).turns = 1
    t.touch("b", 1)
    t.touch("a", 2)                      # a is now the most recent
    t.touch("c", 3)                      # full: b (least recent) goes
    assert list(t.sessions) == ["a", "c"] and t.evicted == 1
    assert t.touch("a", 4).turns == 1    # a kept its state
    assert t.touch("b", 5).turns == 0    # b starts over


def test_approximate_index_keeps_the_newest_hints_per_worker():
    ix = GlobalKVIndex(max_approx_blocks=3)
    ix.note_routed("w", (b"1", b"2"), 0.0)
    ix.note_routed("w", (b"3", b"1"), 1.0)     # 1 refreshed
    ix.note_routed("w", (b"4",), 2.0)          # over 3: 2 (oldest) goes
    assert list(ix.approx["w"]) == [b"3", b"1", b"4"]
    assert ix.approx["w"][b"1"] == 1.0 + ix.ttl_s


def test_approximate_index_drops_hints_past_their_ttl():
    """Regression (soak): hints were only dropped at the cap (2^20 per worker), so the router
    kept every block it ever routed; now those past their TTL go when new ones are noted."""
    ix = GlobalKVIndex(ttl_s=10)
    ix.note_routed("w", (b"1", b"2"), 0.0)     # expire at 10
    ix.note_routed("w", (b"3",), 5.0)          # 15
    ix.note_routed("w", (b"4",), 10.0)         # 20; 1 and 2 still count at 10 itself
    assert list(ix.approx["w"]) == [b"1", b"2", b"3", b"4"]
    ix.note_routed("w", (b"2",), 12.0)         # 1 expired; 2 refreshed to 22
    assert ix.approx["w"] == {b"3": 15.0, b"4": 20.0, b"2": 22.0}
    ix.note_routed("w", (b"5",), 21.0)         # 3 and 4 expired
    assert ix.approx["w"] == {b"2": 22.0, b"5": 31.0}
    assert ix.sizes() == {"local": 0, "l3": 0, "approx": 2}


def test_index_sizes_count_each_set():
    ix = GlobalKVIndex()
    ix.apply("a", [BlockStored([b"1", b"2"], None, [], 16, "L1"), BlockStored([b"1"], None, [], 16, "L2"),
                   BlockStored([b"1", b"2", b"3"], None, [], 16, "L3")], now=0)
    ix.apply("b", [BlockStored([b"1"], None, [], 16, "L1")], now=0)
    ix.note_routed("b", (b"9",), 0.0)
    assert ix.sizes() == {"local": 3, "l3": 3, "approx": 1}

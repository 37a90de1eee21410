"""The router's tables stay bounded (hand-worked LRU cases)."""

from warmpath.router.index import GlobalKVIndex
from warmpath.router.sessions import SessionTable


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

"""The simulated store evicting as Mooncake's master does (sim/lease_store.py): by lease, blocks
never read first; every number by hand."""

import pytest

from warmpath.sim.lease_store import LeaseStore
from warmpath.sim.run import SimSetup, build
from warmpath.sim.store import SharedLink, SimStore
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.launch.topology import resolve


def hashes(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_blocks_never_read_go_first_then_the_least_recently_read():
    s = LeaseStore(20, SharedLink(1e9))        # watermark 0.9: evicts above 18 blocks
    a = hashes("a", 10)
    assert s.put(a, now=0.0) == (a, [])
    assert s.count_prefix(a[:4], now=1.0) == 4  # an existence check leases a0..a3 until 11 s
    assert s.count_prefix([a[4], b"zz", a[5]], now=2.0) == 1   # leading run 1; a4 and a5 leased to 12 s
    b = hashes("b", 9)
    assert s.put(b, now=3.0) == (b, [])         # 10 stored, 10 < 18: no eviction; 19 stored now
    # 19 / 20 = 0.95 > 0.9: evict max(0.05, 0.95 - 0.9 + 0.05) = 0.1 of 19 objects: ceil(1.9) = 2.
    # At 5 s every leased block is protected; of the never-read a6..a9, b0..b8 the two first by hash
    x = [b"x0"]
    assert s.put(x, now=5.0) == (x, [b"a6", b"a7"])
    assert (s.evicted, len(s.blocks)) == (2, 18)


def test_expired_leases_are_evicted_oldest_first_once_nothing_unread_is_left():
    s = LeaseStore(10, SharedLink(1e9), lease_s=10.0)
    a = hashes("a", 10)
    s.put(a, now=0.0)
    for i, h in enumerate(a):                   # a_i read at i seconds: lease to 10 + i
        s.count_prefix([h], now=float(i))
    # at 30 s all leases ended; 10 / 10 = 1.0 > 0.9: evict max(0.05, 0.15) of 10 = ceil(1.5) = 2: a0, a1
    assert s.put([b"x"], now=30.0) == ([b"x"], [b"a0", b"a1"])


def test_a_leased_block_is_not_evicted_and_a_full_store_refuses():
    s = LeaseStore(4, SharedLink(1e9))
    a = hashes("a", 4)
    s.put(a, now=0.0)
    s.count_prefix(a, now=0.0)                  # all four leased until 10 s
    # 4 / 4 > 0.9 but nothing evictable at 1 s: the put is refused and the master is asked to evict
    assert s.put([b"x"], now=1.0) == ([], []) and s.refused == 1
    # at 20 s the leases are over: eviction (flagged, and 1.0 > 0.9) of ceil(0.15 · 4) = 1: the
    # oldest lease, all equal (10 s): by hash, a0
    assert s.put([b"x"], now=20.0) == ([b"x"], [b"a0"])
    assert s.blocks[b"x"] == float("-inf")
    # full again: the next pass evicts ceil(0.15 · 4) = 1, the never-read x before any read block;
    # a1 is present (EXISTS): stored as it was, lease unchanged
    assert s.put([b"a1"], now=21.0) == ([], [b"x"])
    assert s.blocks == {b"a1": 10.0, b"a2": 10.0, b"a3": 10.0}


def test_the_setup_chooses_the_store():
    base = SimSetup(resolve("cpd-1d"), MODELS["llama-3.1-8b"], HARDWARE["b200"], l3_gib=1.0)
    assert type(build(base).store) is SimStore
    assert type(build(SimSetup(**{**base.__dict__, "l3_eviction": "lease"})).store) is LeaseStore
    with pytest.raises(ValueError, match="l3_eviction"):
        build(SimSetup(**{**base.__dict__, "l3_eviction": "fifo"}))

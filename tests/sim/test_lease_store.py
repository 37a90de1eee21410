"""The simulated store evicting as Mooncake's master does (sim/lease_store.py): by lease, shard
by shard; every number by hand (one shard: the store-wide lease order)."""

import random
import zlib

import pytest

from warmpath.launch.topology import resolve
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.lease_store import LeaseStore
from warmpath.sim.run import SimSetup, build
from warmpath.sim.store import SharedLink, SimStore


def hashes(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_reads_lease_and_blocks_never_read_go_together():
    s = LeaseStore(20, SharedLink(1e9), shards=1)   # watermark 0.9: evicts above 18 blocks
    a = hashes("a", 10)
    assert s.put(a, now=0.0) == (a, [])
    assert s.count_prefix(a[:4], now=1.0) == 4   # an existence check leases a0..a3 until 11 s
    assert s.count_prefix([a[4], b"zz", a[5]], now=2.0) == 1   # leading run 1; a4 and a5 leased to 12 s
    b = hashes("b", 9)
    assert s.put(b, now=3.0) == (b, [])          # 10 < 18 stored before: no eviction; 19 now
    # 19 / 20 = 0.95 > 0.9: target max(0.05, 0.95 - 0.9 + 0.05) = 0.1 of 19: ceil(1.9) = 2; the
    # second-oldest lease is a never-read one (-inf) and every lease <= it goes: all 13 never read
    x = [b"x0"]
    assert s.put(x, now=5.0) == (x, [*a[6:], *b])
    assert (s.evicted, list(s.blocks)) == (13, [*a[:6], b"x0"])


def test_expired_leases_oldest_first():
    s = LeaseStore(10, SharedLink(1e9), shards=1)
    a = hashes("a", 10)
    s.put(a, now=0.0)
    for i, h in enumerate(a):                    # a_i read at i seconds: leased to 10 + i
        s.count_prefix([h], now=float(i))
    # at 30 s every lease has ended; 10 / 10 = 1.0: target 0.15 (ceil 1.5 = 2): leases 10 and 11
    assert s.put([b"x"], now=30.0) == ([b"x"], [b"a0", b"a1"])


def test_a_leased_block_stays_and_a_full_store_refuses():
    s = LeaseStore(4, SharedLink(1e9), shards=1)
    a = hashes("a", 4)
    s.put(a, now=0.0)
    s.count_prefix(a, now=0.0)                   # all four leased until 10 s
    # full, nothing evictable at 1 s: refused, and the master is asked to evict
    assert s.put([b"x"], now=1.0) == ([], []) and s.refused == 1
    # at 20 s: ceil(0.15 · 4) = 1, the oldest lease is 10 s and all four have it: all go
    assert s.put([b"x"], now=20.0) == ([b"x"], a)
    assert s.put([b"x", b"y"], now=21.0) == ([b"y"], [])   # 1 / 4 < 0.9: no eviction; x EXISTS
    assert s.blocks == {b"x": float("-inf"), b"y": float("-inf")}


class Start:
    """The master's random first shard, fixed."""

    def __init__(self, k: int) -> None:
        self.k = k

    def randrange(self, n: int) -> int:
        return self.k


@pytest.mark.parametrize("start", [0, 1])
def test_shard_by_shard_then_the_second_pass(start):
    """Two shards: A holds ten blocks leased until 100 s, B two read long ago (leases 11, 12).
    At 30 s, 12 of 12: target 0.15, lower bound max(0.075, 0.1) = 0.1.
    From A: A counts 10, share ceil(1.5) = 2, nothing free; B counts 12, share ceil(1.8) = 2:
    both of B. From B: B counts 2, share ceil(0.3) = 1: lease 11 (b0); A nothing free; the
    first pass took 1 < ceil(12 · 0.1) = 2: the second pass takes b1. Either way b0 and b1."""
    pick = lambda parity, n: [h for h in (f"k{i}".encode() for i in range(200))   # noqa: E731
                              if zlib.crc32(h) % 2 == parity][:n]
    shard_a, shard_b = pick(0, 10), pick(1, 2)     # A is shard 0, B shard 1; start: the first
    s = LeaseStore(12, SharedLink(1e9), shards=2, _rng=Start(start))
    s.put(shard_a + shard_b, now=0.0)
    s.count_prefix(shard_b[:1], now=1.0)
    s.count_prefix(shard_b[1:], now=2.0)
    s.count_prefix(shard_a, now=90.0)
    assert sorted(s.evict(30.0)) == sorted(shard_b) and s.evicted == 2


def test_the_setup_chooses_the_store():
    base = SimSetup(resolve("cpd-1d"), MODELS["llama-3.1-8b"], HARDWARE["b200"], l3_gib=1.0)
    assert type(build(base).store) is SimStore
    assert type(build(SimSetup(**{**base.__dict__, "l3_eviction": "lease"})).store) is LeaseStore
    with pytest.raises(ValueError, match="l3_eviction"):
        build(SimSetup(**{**base.__dict__, "l3_eviction": "fifo"}))


def test_the_first_shard_follows_the_setups_seed():
    base = SimSetup(resolve("cpd-1d"), MODELS["llama-3.1-8b"], HARDWARE["b200"], l3_gib=1.0, l3_eviction="lease")
    draws = {seed: [build(SimSetup(**{**base.__dict__, "seed": seed})).store._rng.randrange(1024) for _ in range(2)]
             for seed in (3, 4)}
    assert draws[3] == [random.Random("3/l3").randrange(1024)] * 2   # a fresh store per build, same draw
    assert draws[4] == [random.Random("4/l3").randrange(1024)] * 2

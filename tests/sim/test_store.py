"""The simulated L3 refuses puts when full, as Mooncake does, and the decode worker that
cannot find the refused blocks recomputes them (every number by hand; no torch)."""

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.sequence import SamplingParams, Sequence
from warmpath.engine.tier_rules import TierRules
from warmpath.kv.block_pool import BlockPool
from warmpath.kv.hashing import KVNamespace
from warmpath.kv.load_cost import LoadCostModel
from warmpath.sim.store import SharedLink, SimStore
from warmpath.sim.tier_mover import SimTierMover

BS = 4
NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=BS)


def hashes(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_a_full_store_refuses_and_the_master_evicts_before_the_next_put():
    s = SimStore(20, SharedLink(1e9))          # watermark 0.95 · 20 = 19; eviction ceil(0.05 · 20) = 1
    a, b = hashes("a", 15), hashes("b", 10)
    assert s.put(a) == (a, [])
    # 5 of b fit (20 of 20), 5 are refused: not stored, nothing evicted for them
    assert s.put(b) == (b[:5], []) and s.refused == 5 and len(s.blocks) == 20
    # the next put finds 20 >= 19: the master has evicted the LRU a0; one fits, one refused
    x = hashes("x", 2)
    assert s.put(x) == ([x[0]], [a[0]])
    assert (s.refused, s.evicted, len(s.blocks)) == (6, 1, 20)
    # present blocks are touched, not refused: a1 (LRU) becomes the most recent
    s2 = SimStore(4, SharedLink(1e9))
    s2.put(hashes("c", 3))                     # 3 < 0.95 · 4 = 3.8: no eviction next time
    assert s2.put([b"c0", b"d0", b"d1"]) == ([b"d0"], []) and s2.refused == 1
    assert list(s2.blocks) == [b"c1", b"c2", b"c0", b"d0"]


def test_nothing_fits_in_a_store_of_no_capacity():
    s = SimStore(0, SharedLink(1e9))
    assert s.put(hashes("a", 3)) == ([], []) and s.refused == 3


def worker(store: SimStore, write_mode: str):
    pool = BlockPool(16, enable_caching=True)
    mover = SimTierMover(0, store, 1000, 1e9, 1e9)
    rules = TierRules(mover, pool, BS, write_mode, LoadCostModel("always"), lambda batch: None,
                      tokens_in_events=False)
    return BlockManager(pool, BS), mover, rules


def test_the_decode_worker_recomputes_the_blocks_the_store_refused():
    store = SimStore(4, SharedLink(1e9))
    tokens = list(range(25))                   # 6 full blocks and one token
    # the prefill worker computes the prompt and writes its 6 blocks through: 4 fit, 2 refused
    bm, _, prefill = worker(store, "write-through")
    seq = Sequence("p", tokens, SamplingParams(), NS)
    assert bm.allocate_slots(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    bm.seal_full_blocks(seq)
    h = seq.full_block_hashes()
    assert prefill.flush() == h[:4] and store.refused == 2
    assert list(prefill.l3_known) == h[:4]     # only what the store took is announced
    # the decode worker finds 4 blocks in L3: 16 tokens loaded, 25 - 16 = 9 recomputed
    _, mover, decode = worker(store, "none")
    d = Sequence("d", tokens, SamplingParams(), NS)
    assert decode.lookup(d, 0) == 4
    decode.schedule_load(d, 0, 4)
    d.num_computed_tokens = d.num_cached_tokens = 16   # as the scheduler does
    decode.apply_loads()
    assert (d.num_computed_tokens, d.num_tokens - d.num_computed_tokens) == (16, 9)
    assert decode.stats.loaded_tokens["L3"] == 16 and decode.stats.load_failures == 0
    assert d.cached_by_tier == {"L1": 0, "L2": 0, "L3": 16}

"""TierRules over the simulator's mover: every decision worked out by hand (no torch)."""

import inspect

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.sequence import SamplingParams, Sequence
from warmpath.engine.tier_rules import TierRules
from warmpath.engine.tier_seams import LoadResult
from warmpath.kv.block_pool import BlockPool
from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.hashing import KVNamespace
from warmpath.kv.load_cost import LoadCostModel, TransferFit
from warmpath.sim.store import SharedLink, SimStore
from warmpath.sim.tier_mover import SimTierMover

BS = 4
NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=BS)


def setup(blocks, l2, store_blocks, write_mode):
    pool = BlockPool(blocks, enable_caching=True)
    store = SimStore(store_blocks, SharedLink(1e9))
    mover = SimTierMover(l2, store, 1000, 1e9, 1e9)
    batches = []
    rules = TierRules(mover, pool, BS, write_mode, LoadCostModel("always"), batches.append,
                      tokens_in_events=False)
    return pool, BlockManager(pool, BS), mover, rules, batches


def computed(bm, tokens, rid):
    """A sequence whose ``tokens`` were all computed (its full blocks sealed)."""
    seq = Sequence(rid, tokens, SamplingParams(), NS)
    assert bm.allocate_slots(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    bm.seal_full_blocks(seq)
    return seq


def test_write_through_announces_exactly_what_the_store_took():
    pool, bm, mover, rules, batches = setup(4, 0, 2, "write-through")
    seq = computed(bm, list(range(12)), "a")
    h0, h1, h2 = seq.full_block_hashes()
    # store of 2 blocks: h0 and h1 go in, h2 is refused (full, as Mooncake's NO_SPACE)
    assert rules.flush() == [h0, h1]
    assert batches == [[AllBlocksCleared(), BlockStored([h0, h1, h2], None, [], BS, "L1"),
                        BlockStored([h0, h1], None, [], BS, "L3")]]
    assert list(rules.l3_known) == [h0, h1] and mover.put_blocks == 2 and mover.store.refused == 1
    assert rules.flush() == [] and len(batches) == 1   # nothing new: nothing published
    # a second worker writing h0, h1: at 2 of 2 (over the 0.95 watermark) the master has
    # evicted ceil(0.05 · 2) = 1 block, the LRU h0, since the last put; h0 is written again
    # (not announced as removed: it is back), h1 is present: announced, not written
    _, bm2, mover2, rules2, batches2 = setup(4, 0, 2, "write-through")
    mover2.store = mover.store
    computed(bm2, list(range(8)), "b")
    assert rules2.flush() == [h0] and list(mover.store.blocks) == [h0, h1]
    assert batches2[0][2:] == [BlockStored([h0, h1], None, [], BS, "L3")]
    assert mover.store.evicted == 0 and mover.store.refused == 1
    computed(bm2, list(range(4)), "c")        # h0 is sealed again (its L1 block was freed)
    assert rules2.flush() == []                # present in the store: announced, not written


def test_l1_eviction_demotes_and_write_back_spills_the_l2_victim():
    pool, bm, mover, rules, batches = setup(2, 1, 4, "write-back")
    a = computed(bm, list(range(8)), "a")
    a0, a1 = a.full_block_hashes()
    bm.free(a)
    rules.flush()
    computed(bm, list(range(100, 108)), "b")   # takes both of a's blocks from L1
    rules.flush()
    ev = batches[1]
    first, second = ev[0].block_hashes[0], ev[2].block_hashes[0]
    assert {first, second} == {a0, a1}
    # first evicted: L1 removed, demoted into the empty L2. Second: L2 is full, its victim
    # (first) goes to L3 before its slot is overwritten, then leaves L2.
    assert ev[:4] == [BlockRemoved([first], "L1"), BlockStored([first], None, [], BS, "L2"),
                      BlockRemoved([second], "L1"), BlockStored([first], None, [], BS, "L3")]
    assert ev[4:6] == [BlockRemoved([first], "L2"), BlockStored([second], None, [], BS, "L2")]
    assert list(mover.l2._map) == [second] and list(mover.store.blocks) == [first]
    assert rules.stats.l1_evictions == 2 and rules.stats.l2_evictions == 1


def test_lookup_loads_l2_then_l3_and_a_failed_load_is_recomputed_and_uncounted():
    pool, bm, mover, rules, batches = setup(4, 2, 4, "none")
    tokens = list(range(13))                   # 3 full blocks, all lookable ((13 - 1) // 4)
    probe = Sequence("p", tokens, SamplingParams(), NS)
    h0, h1, h2 = probe.full_block_hashes()
    mover.l2.insert(h0)
    mover.store.put([h1, h2])
    seq = Sequence("s", tokens, SamplingParams(), NS)
    assert rules.lookup(seq, 0) == 3           # L2: h0; then L3: h1, h2
    rules.schedule_load(seq, 0, 3)
    seq.num_computed_tokens = seq.num_cached_tokens = 12     # as the scheduler does
    assert seq.cached_by_tier == {"L1": 0, "L2": 4, "L3": 8}
    del mover.store.blocks[h2]                 # the store lost h2 before the load
    rules.apply_loads()
    assert (seq.num_computed_tokens, seq.num_cached_tokens) == (8, 8)
    assert seq.cached_by_tier == {"L1": 0, "L2": 4, "L3": 4}
    assert rules.stats.load_failures == 1 and rules.stats.loaded_tokens == {"L2": 4, "L3": 4}
    assert list(rules.l3_known) == [h1]        # a block read from L3 is known to be there
    assert mover.load_s == 1000 / 1e9 + mover.store.link.latency_s + 1000 / 1e9


def test_the_simulator_uses_the_rules_and_has_no_tier_rules_of_its_own():
    import warmpath.sim.worker as sw

    src = inspect.getsource(sw)
    for name in ("_on_seal", "_on_evict", "on_seal", "on_l1_evict", "lookup", "schedule_load"):
        assert not hasattr(sw.SimWorker, name), name
    assert "TierRules(" in src and "write-back" not in src and "BlockStored" not in src


def test_transfer_fit_priors_until_two_sizes_then_the_line():
    f = TransferFit(overhead_s=1e-3, bytes_s=1e9, decay=1.0)
    f.update(1000, 0.002)
    f.update(1000, 0.003)
    assert (f.overhead_s, f.bytes_s) == (1e-3, 1e9)        # one size: priors hold
    g = TransferFit(overhead_s=5.0, bytes_s=1.0, decay=0.5)
    g.update(1000, 0.002)
    g.update(3000, 0.004)                                   # seconds = 0.001 + bytes / 1e6
    assert abs(g.bytes_s - 1e6) < 1e-3 and abs(g.overhead_s - 0.001) < 1e-12
    g.update(2000, 0.003)                                   # on the line: unchanged
    assert abs(g.bytes_s - 1e6) < 1e-3 and abs(g.overhead_s - 0.001) < 1e-12
    m = LoadCostModel()
    m.observe_transfer("L3", 1000, 0.002)
    m.observe_transfer("L3", 3000, 0.004)
    assert abs(m.load_seconds("L3", 5000) - 0.006) < 1e-12


def test_refused_blocks_are_counted_withdrawn_and_recomputed():
    pool, bm, mover, rules, batches = setup(4, 2, 4, "none")
    tokens = list(range(13))
    h0, h1, h2 = Sequence("p", tokens, SamplingParams(), NS).full_block_hashes()
    mover.l2.insert(h0)
    mover.store.put([h1, h2])
    rules.flush()
    rules._note_in_l3([h1, h2])                # announced earlier by this worker

    def refuse(seq, first_block, n_l2, n_l3):  # h0 from L2 passes; h1 from L3 fails its checksum
        return LoadResult(1, 0, rejected=[("L3", h1, "checksum")])

    mover.load = refuse
    seq = Sequence("s", tokens, SamplingParams(), NS)
    assert rules.lookup(seq, 0) == 3
    rules.schedule_load(seq, 0, 3)
    seq.num_computed_tokens = seq.num_cached_tokens = 12
    rules.apply_loads()
    assert (seq.num_computed_tokens, seq.cached_by_tier) == (4, {"L1": 0, "L2": 4, "L3": 0})
    assert rules.stats.verify_failures == {("L3", "checksum"): 1} and rules.stats.load_failures == 2
    assert list(rules.l3_known) == [h2]        # h1 withdrawn
    mover.l2.remove(h0)                        # an L2 block the mover dropped as broken
    rules._refused([("L2", h0, "checksum")])
    rules.flush()
    assert batches[-1] == [BlockRemoved([h1], "L3"), BlockRemoved([h0], "L2")]
    assert rules.stats.verify_failures == {("L3", "checksum"): 1, ("L2", "checksum"): 1}

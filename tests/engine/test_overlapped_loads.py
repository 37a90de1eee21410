"""Overlapped L3 loads (``tier_rules.py``): the scheduler keeps a loading sequence out of
the batches, the running ones go on, and the load lands as a step's load would. The rules
and the scheduler over the simulator's mover, worked out by hand (no torch)."""

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.scheduler import Scheduler, SchedulerConfig
from warmpath.engine.sequence import SamplingParams, Sequence, SeqStatus
from warmpath.engine.tier_rules import TierRules
from warmpath.kv.block_pool import BlockPool
from warmpath.kv.hashing import KVNamespace
from warmpath.kv.load_cost import LoadCostModel
from warmpath.sim.store import SharedLink, SimStore
from warmpath.sim.tier_mover import SimTierMover

BS = 4
NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=BS)
P = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


class BusyMover(SimTierMover):
    """The simulator's mover whose store path is held by a load on another thread while ``busy``."""

    busy = False

    def put_l3(self, blocks):
        return None if self.busy else super().put_l3(blocks)


class LossyMover(SimTierMover):
    """The simulator's mover whose store loses ``lost`` before a started load reads it."""

    lost: bytes | None = None

    def load(self, seq, first_block, n_l2, n_l3):
        self.store.blocks.pop(self.lost, None)
        return super().load(seq, first_block, n_l2, n_l3)


def setup(overlap=True, blocks=16, mover_cls=SimTierMover):
    pool = BlockPool(blocks, enable_caching=True)
    store = SimStore(64, SharedLink(1e6, latency_s=0.0))   # 1 MB/s, no latency: a 1,000-byte block takes 1 ms
    mover = mover_cls(0, store, 1000, 1e9, 1e6, overlap=overlap)
    rules = TierRules(mover, pool, BS, "write-through", LoadCostModel("always"), None,
                      tokens_in_events=False)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), BlockManager(pool, BS), external=rules)
    return pool, mover, rules, sched


def step(sched):
    out = sched.schedule()
    sched.update(out, {s.seq.request_id: 7 for s in out.scheduled if s.samples}, eos_ids=())
    return [(s.seq.request_id, s.num_tokens) for s in out.scheduled]


def decoding(sched, rid="d"):
    """A sequence of 3 tokens, prefilled: from now on it takes one token a step."""
    d = Sequence(rid, [900, 901, 902], P, NS)
    sched.add(d)
    assert step(sched) == [(rid, 3)]
    return d


def in_store(mover, tokens):
    """A 13-token prompt whose 3 lookable blocks ((13 - 1) // 4) the store holds."""
    probe = Sequence("probe", tokens, P, NS)
    hashes = probe.full_block_hashes()
    mover.store.put(hashes, 0.0)
    return hashes


def test_the_batch_goes_on_while_a_prompt_loads_and_it_runs_when_the_load_lands():
    pool, mover, rules, sched = setup()
    d = decoding(sched)
    hashes = in_store(mover, list(range(13)))
    s = Sequence("s", list(range(13)), P, NS)
    sched.add(s)
    # s is admitted: its 3 blocks allocated and counted computed, but it is not in the batch
    assert step(sched) == [("d", 1)]
    assert s.status == SeqStatus.LOADING and len(s.block_ids) == 3 and s.num_computed_tokens == 12
    assert s.cached_by_tier == {"L1": 0, "L2": 0, "L3": 12} and rules.loads_in_flight == 1
    # 3 blocks at 1 MB/s land 3 ms after they started (at 0.0)
    assert mover.next_landing() == 3000 / 1e6
    mover.now = 0.002
    assert step(sched) == [("d", 1)] and s.status == SeqStatus.LOADING
    mover.now = 0.003
    # landed: s computes its one uncached token and samples; d goes on in the same batch
    assert step(sched) == [("d", 1), ("s", 1)]
    assert s.status == SeqStatus.RUNNING and s.output_token_ids == [7] and s.num_computed_tokens == 13
    assert rules.stats.l3_loaded == 3 and rules.loads_in_flight == 0 and mover.next_landing() is None
    assert list(rules.l3_known) == hashes and d.output_token_ids == [7] * 4   # its prefill + 3 steps
    assert mover.load_s == 0.0                      # nothing was charged to a step


def test_a_block_lost_before_the_load_lands_is_recomputed_and_uncounted():
    pool, mover, rules, sched = setup(mover_cls=LossyMover)
    hashes = in_store(mover, list(range(13)))
    mover.lost = hashes[2]                              # gone before the transfer reads it
    s = Sequence("s", list(range(13)), P, NS)
    sched.add(s)
    assert step(sched) == [] and sched.has_work()      # only a load in flight
    assert mover.next_landing() == 2000 / 1e6           # 2 blocks read
    mover.now = 1.0
    # the third block is recomputed with the tail: 5 tokens from token 8
    assert step(sched) == [("s", 5)]
    assert (s.num_computed_tokens, s.num_cached_tokens) == (13, 8)
    assert s.cached_by_tier == {"L1": 0, "L2": 0, "L3": 8} and rules.stats.load_failures == 1


def test_a_request_finished_while_its_blocks_load_frees_them_only_when_the_load_lands():
    pool, mover, rules, sched = setup()
    in_store(mover, list(range(13)))
    s = Sequence("s", list(range(13)), P, NS)
    sched.add(s)
    free = pool.num_free
    step(sched)
    assert pool.num_free == free - 3
    sched.finish(s, "abort")                  # the loader still writes into its 3 blocks
    assert s.status == SeqStatus.FINISHED and pool.num_free == free - 3 and not sched.has_work()
    mover.now = 1.0
    assert step(sched) == [] and pool.num_free == free and rules.loads_in_flight == 0


def test_loading_sequences_hold_running_slots():
    pool, mover, rules, sched = setup()
    sched.cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=64)
    in_store(mover, list(range(13)))
    sched.add(Sequence("s", list(range(13)), P, NS))
    sched.add(Sequence("t", list(range(500, 505)), P, NS))
    assert step(sched) == [] and len(sched.waiting) == 1   # t waits: s holds the one slot


def test_without_overlap_the_load_is_in_the_step():
    pool, mover, rules, sched = setup(overlap=False)
    in_store(mover, list(range(13)))
    s = Sequence("s", list(range(13)), P, NS)
    sched.add(s)
    out = sched.schedule()
    assert [(x.seq.request_id, x.num_tokens) for x in out.scheduled] == [("s", 1)]
    rules.apply_loads()
    assert mover.load_s == 3000 / 1e6 and mover.next_landing() is None


def test_a_put_the_loader_blocks_is_kept_for_the_next_flush():
    pool, mover, rules, sched = setup(mover_cls=BusyMover)
    s = Sequence("s", list(range(9)), P, NS)
    sched.add(s)
    mover.busy = True
    step(sched)                              # 9 tokens computed: 2 blocks sealed
    assert rules.flush() == [] and mover.put_blocks == 0
    mover.busy = False
    assert rules.flush() == s.full_block_hashes() and mover.put_blocks == 2

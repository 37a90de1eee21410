"""L1 → L2 → L3 with the real model and a real Mooncake store."""

import dataclasses
import random

import pytest

from warmpath.engine.tiered_kv import TierConfig
from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.sequence import SamplingParams
from warmpath.kv.mooncake_service import MooncakeService
from warmpath.kv.mooncake_store import MooncakeConfig

G = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def prompt(tok, text, n):
    ids = tok.encode(text * 200)[:n]
    assert len(ids) == n
    return ids


@pytest.fixture(scope="module")
def prompts(smollm):
    tok = smollm.tokenizer
    return {"p": prompt(tok, "Caches keep recent data near the processor. ", 321),
            "q": prompt(tok, "Bread needs flour, water, salt and time. ", 321),
            "r": prompt(tok, "Rivers carve valleys over many centuries. ", 200)}


@pytest.fixture(scope="module")
def reference(smollm, prompts):
    eng = LLMEngine(EngineConfig(num_blocks=128, enable_prefix_caching=False), loaded=smollm)
    return {k: eng.generate([v], G)[0] for k, v in prompts.items()}


def engine(loaded, blocks=32, l2_gib=0.05, l3=None, write="write-back", load="always", salt_events=True):
    return LLMEngine(EngineConfig(num_blocks=blocks, tiers=TierConfig(
        l2_gib=l2_gib, l3=l3, write_mode=write, load_mode=load, events=salt_events)), loaded=loaded)


def l3cfg(svc):
    return MooncakeConfig(master=svc.master, metadata=svc.metadata, op_timeout_s=1.0, retry_after_s=0.5)


def test_l1_to_l2_demotion_and_promotion_exact(smollm, prompts, reference):
    # 32 L1 blocks: p needs 21 (321 tokens + 8 out), q too, so q evicts p's blocks to L2.
    eng = engine(smollm, l3=None)
    assert eng.generate([prompts["p"]], G)[0] == reference["p"]
    assert eng.tiers.stats.l1_evictions == 0 and len(eng.tiers.l2.index) == 0
    assert eng.generate([prompts["q"]], G)[0] == reference["q"]
    # p held 21 blocks (328 computed tokens: 20 sealed + 1 partial). q's 21 blocks take
    # p's partial block and the 11 never-used ones first, then 9 of p's sealed blocks,
    # tail first (blocks 19..11), which are demoted to L2.
    assert eng.tiers.stats.l1_evictions == 9
    assert len(eng.tiers.l2.index) == 9
    # on /metrics: nothing held by a request; p's 11 + q's 20 sealed blocks findable in L1, 9 in L2
    assert _tier_blocks(eng) == {("L1", "in_use"): 0, ("L1", "cached"): 31, ("L1", "capacity"): 32,
                                 ("L2", "cached"): 9, ("L2", "capacity"): eng.tiers.l2.index.capacity}
    assert eng.generate([prompts["p"]], G)[0] == reference["p"]
    # p may reuse 20 blocks ((321-1)//16): 11 still in L1, the other 9 come back from L2.
    assert eng.tiers.stats.l2_hits == 9
    assert eng.tiers.stats.loaded_tokens["L2"] == 144
    assert eng.scheduler.prefix_hit_tokens == 320
    eng.pool.check_integrity()
    eng.tiers.l2.index.check_integrity()
    eng.close()


def test_random_requests_and_aborts_leak_nothing(smollm):
    rng = random.Random(1)
    eng = engine(smollm, blocks=24, l2_gib=0.01)
    base = [rng.randrange(100, 40000) for _ in range(150)]
    live = []
    for i in range(40):
        if rng.random() < 0.5:
            n = rng.randint(20, 150)
            ids = base[:n] if rng.random() < 0.6 else [rng.randrange(100, 40000) for _ in range(n)]
            live.append(eng.add_request(ids, SamplingParams(max_tokens=rng.randint(1, 6), temperature=0)))
        if live and rng.random() < 0.2:
            eng.abort(live.pop(rng.randrange(len(live))))
        eng.step()
        eng.pool.check_integrity()
    while eng.has_work():
        eng.step()
    assert eng.pool.num_free == 24
    assert eng.tiers.stats.l1_evictions > 0 and len(eng.tiers.l2.index) > 0  # L2 took part
    eng.pool.check_integrity()
    eng.tiers.l2.index.check_integrity()
    eng.close()


def test_l3_reuse_across_engines_and_tenants(smollm, prompts, reference, mooncake):
    a = engine(smollm, l3=l3cfg(mooncake), write="write-through")
    assert a.generate([prompts["r"]], G)[0] == reference["r"]
    assert a.tiers.l3.stats.blocks_written == 12  # 200 prompt + 7 generated tokens: 12 full blocks
    b = engine(smollm, l3=l3cfg(mooncake))
    assert b.generate([prompts["r"]], G)[0] == reference["r"]
    assert b.tiers.stats.loaded_tokens["L3"] == 192
    assert b.scheduler.prefix_hit_tokens == 192
    # Another tenant (cache salt) never sees those blocks, in any tier.
    c = engine(smollm, l3=l3cfg(mooncake))
    c.add_request(prompts["r"], G, request_id="t2", cache_salt="tenant-2")
    while c.has_work():
        c.step()
    assert c.scheduler.prefix_hit_tokens == 0 and c.tiers.l3.stats.hits == 0
    for e in (a, b, c):
        e.close()


def test_corrupt_l3_block_is_detected_and_recomputed(smollm, prompts, reference, mooncake):
    a = engine(smollm, l3=l3cfg(mooncake), write="write-through")
    a.generate([prompts["q"]], G)
    seq_hashes = __import__("warmpath.engine.sequence", fromlist=["Sequence"]).Sequence(
        "x", prompts["q"], G, a.namespace).full_block_hashes()
    st = a.tiers.l3._store
    key = a.tiers.l3.key(seq_hashes[5])
    good = st.get(key)
    assert len(good) == a.tiers.l3.slot
    bad = bytearray(good)
    bad[-10] ^= 0xFF
    assert st.batch_remove([key], True) == [0] and st.put(key, bytes(bad)) == 0
    trunc_key = a.tiers.l3.key(seq_hashes[9])
    assert st.batch_remove([trunc_key], True) == [0] and st.put(trunc_key, good[:1000]) == 0
    b = engine(smollm, l3=l3cfg(mooncake))
    assert b.generate([prompts["q"]], G)[0] == reference["q"]
    assert b.tiers.l3.stats.corrupt == 1
    assert b.tiers.stats.loaded_tokens["L3"] == 5 * 16   # blocks before the corrupt one
    assert b.tiers.stats.load_failures == 15
    assert b.tiers.stats.verify_failures == {("L3", "checksum"): 1}
    for e in (a, b):
        e.close()


def _verify_failures(eng):
    from warmpath.worker.tier_metrics import TierCollector

    fam = next(f for f in TierCollector(eng, "m").collect() if f.name == "warmpath_kv_verify_failures")
    return {(s.labels["tier"], s.labels["reason"]): s.value for s in fam.samples if s.name.endswith("_total")}


def _tier_blocks(eng):
    from warmpath.worker.tier_metrics import TierCollector

    fam = next(f for f in TierCollector(eng, "m").collect() if f.name == "warmpath_kv_tier_blocks")
    return {(s.labels["tier"], s.labels["state"]): s.value for s in fam.samples}


def test_garbage_or_a_misplaced_block_in_l3_is_recomputed_and_removed(smollm, prompts, reference, mooncake):
    """Another client writes garbage over block 3 of p in the store, and block 3's bytes under
    block 4's key of r: each reader refuses the block (while it fetches the next chunk),
    recomputes from there with the same greedy output as without L3, counts one failure, and
    the bad entry leaves the store."""
    from warmpath.engine.sequence import Sequence

    a = engine(smollm, l3=l3cfg(mooncake), write="write-through")
    a.generate([prompts["p"]], G)
    a.generate([prompts["r"]], G)
    st, l3 = a.tiers.l3._store, a.tiers.l3
    hp = Sequence("x", prompts["p"], G, a.namespace).full_block_hashes()
    hr = Sequence("y", prompts["r"], G, a.namespace).full_block_hashes()
    garbage = bytes(range(256)) * (l3.slot // 256) + bytes(l3.slot % 256)
    for key, data in ((l3.key(hp[3]), garbage), (l3.key(hr[4]), st.get(l3.key(hr[3])))):
        assert len(data) == l3.slot and st.remove(key, True) == 0 and st.put(key, data) == 0
    small = dataclasses.replace(l3cfg(mooncake), staging_blocks=4)   # chunks of 2: the bad one is not the first
    for name, h, reason in (("p", hp[3], "format"), ("r", hr[4], "key")):
        b = engine(smollm, l3=small)
        assert b.generate([prompts[name]], G)[0] == reference[name]
        assert b.tiers.stats.verify_failures == {("L3", reason): 1} == _verify_failures(b)
        n, planned = (3, 20) if name == "p" else (4, 12)   # (321 - 1) // 16, (200 - 1) // 16 blocks
        assert b.tiers.stats.loaded_tokens["L3"] == n * 16 and b.tiers.stats.load_failures == planned - n
        assert st.is_exist(l3.key(h)) == 0       # removed: the next writer can put the real block
        b.close()
    a.close()


def test_full_l2_and_full_l3_only_miss(smollm, reference, prompts):
    with MooncakeService(segment_bytes=16 << 20) as svc:  # ~22 blocks fit
        eng = engine(smollm, blocks=24, l2_gib=0.002, l3=l3cfg(svc), write="write-through")
        assert eng.tiers.l2.index.capacity == 2
        for k in ("p", "q", "r", "p"):
            assert eng.generate([prompts[k]], G)[0] == reference[k]
        st = eng.tiers.l3.stats
        assert st.errors == 0
        assert st.rejected_full > 0      # the store was full at times
        from warmpath.worker.tier_metrics import TierCollector

        fam = next(f for f in TierCollector(eng, "m").collect() if f.name == "warmpath_kv_l3_rejected_full_blocks")
        assert [s.value for s in fam.samples if s.name.endswith("_total")] == [st.rejected_full]
        assert st.blocks_written > 22    # more than fits at once: Mooncake evicted some
        eng.pool.check_integrity()
        eng.close()


def test_write_back_spills_the_full_l2s_victims_to_l3(smollm, reference, prompts):
    """Regression (found by benchmarks/peers/vs_llamacpp.py at 0.4 sessions/s): with L2 full, every
    L1 eviction first sends L2's oldest block to L3 — the mover compared that block's identity
    object with its hash, so the first such spill stopped the engine."""
    with MooncakeService(segment_bytes=64 << 20) as svc:
        eng = engine(smollm, blocks=24, l2_gib=0.002, l3=l3cfg(svc), write="write-back")
        assert eng.tiers.l2.index.capacity == 2
        for k in ("p", "q", "r"):
            assert eng.generate([prompts[k]], G)[0] == reference[k]
        assert eng.tiers.stats.l2_evictions > 0
        assert eng.tiers.l3.stats.blocks_written == eng.tiers.stats.l2_evictions   # each victim went to L3
        fresh = engine(smollm, blocks=64, l2_gib=0, l3=l3cfg(svc))
        assert fresh.generate([prompts["p"]], G)[0] == reference["p"]
        assert fresh.tiers.stats.loaded_tokens["L3"] > 0    # p's spilled blocks, verified and used
        eng.pool.check_integrity()
        eng.close(), fresh.close()


def test_master_killed_then_back(smollm, prompts, reference):
    svc = MooncakeService(segment_bytes=64 << 20).start()
    try:
        a = engine(smollm, l3=l3cfg(svc), write="write-through")
        assert a.generate([prompts["r"]], G)[0] == reference["r"]
        svc.kill_master()
        b = engine(smollm, l3=l3cfg(svc))
        # every request is still answered, by recompute
        assert b.generate([prompts["r"]], G)[0] == reference["r"]
        assert b.generate([prompts["p"]], G)[0] == reference["p"]
        assert b.tiers.l3.stats.fallbacks >= 1
        assert b.tiers.stats.loaded_tokens["L3"] == 0
        # same ports; the store restarts empty. A new master knows no segment, so the holder
        # remounts too (the launcher's own path); a fixed sleep here lost the race under load
        assert svc.restart_dead() == ["master", "holder"]
        import time
        deadline = time.monotonic() + 15
        while not b.tiers.l3.probe() and time.monotonic() < deadline:   # b's client reconnects
            time.sleep(0.2)
        assert b.tiers.l3.probe()
        c = engine(smollm, l3=l3cfg(svc), write="write-through")
        assert c.generate([prompts["q"]], G)[0] == reference["q"]
        assert c.tiers.l3.stats.blocks_written > 0
        assert b.generate([prompts["q"]], G)[0] == reference["q"]
        assert b.tiers.stats.loaded_tokens["L3"] > 0  # L3 use resumed
        for e in (a, b, c):
            e.close()
    finally:
        svc.stop()


def test_engine_publishes_kv_events(smollm, prompts):
    import time

    from warmpath.kv.events import BlockRemoved, BlockStored, KVEventSubscriber

    eng = engine(smollm, l3=None)
    sub = KVEventSubscriber(eng.tiers.events.endpoint, eng.tiers.events.replay_endpoint)
    try:
        time.sleep(0.3)
        eng.generate([prompts["p"]], G)
        eng.generate([prompts["q"]], G)
        events = [e for _, batch, _ in sub.poll(2000) for e in batch]
        stored_l1 = [e for e in events if isinstance(e, BlockStored) and e.medium == "L1"]
        assert len(stored_l1) == 40          # 20 sealed blocks per request
        assert stored_l1[0].token_ids == prompts["p"][:16]
        removed = [e for e in events if isinstance(e, BlockRemoved)]
        assert len(removed) == 9 and {e.medium for e in removed} == {"L1"}
        assert sum(1 for e in events if isinstance(e, BlockStored) and e.medium == "L2") == 9
    finally:
        sub.close()
        eng.close()


def test_prefill_to_decode_handoff_through_the_store(smollm, prompts, reference, mooncake):
    """The P→D handoff of the cluster: P computes the prompt and writes its blocks through
    to L3; D gets the prompt with P's first token as ``output_prefix``, reports that token at
    once, loads the blocks and only computes the tail. The text equals one engine's."""
    p = engine(smollm, l3=l3cfg(mooncake), write="write-through")
    first = p.generate([prompts["p"]], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))[0]
    assert first == reference["p"][:1]
    d = engine(smollm, l3=l3cfg(mooncake))
    n = len(reference["p"])
    rid = d.add_request(prompts["p"], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True),
                        output_prefix=first)
    init = d.take_initial_output(rid)
    assert (init.new_token_ids, init.finished, init.completion_tokens) == (first, False, 1)
    assert init.text == d.tokenizer.decode(first)
    assert d.take_initial_output(rid) is None
    got, text = list(first), init.text
    while d.has_work():
        for o in d.step():
            got += o.new_token_ids
            text += o.text
            last = o
    assert got == reference["p"] and last.completion_tokens == n and last.finish_reason == "length"
    assert text == d.tokenizer.decode(reference["p"])
    # 322 tokens known at D: 20 full blocks loaded from L3, only 2 tokens computed
    assert d.tiers.stats.loaded_tokens["L3"] == 320
    assert d.tiers.l3.stats.bytes_read == 20 * d.tiers.l3.slot
    # the request's own L3 load time: the store's read and its checks (at least the read)
    assert last.l3_load_s >= d.tiers.l3.stats.read_seconds > 0
    # a handed-off token that already ends the request never reaches the scheduler
    rid = d.add_request(prompts["p"], SamplingParams(max_tokens=1, temperature=0), output_prefix=first)
    done = d.take_initial_output(rid)
    assert (done.finished, done.finish_reason) == (True, "length") and not d.has_work()
    eos = d.eos_ids[0]
    rid = d.add_request(prompts["p"], SamplingParams(max_tokens=5, temperature=0), output_prefix=[eos])
    assert d.take_initial_output(rid).finish_reason == "stop" and not d.has_work()
    # what the HTTP thread may report before the engine thread gets to the request
    sp = SamplingParams(max_tokens=5, temperature=0)
    early = d.early_prefix_output("r", 7, sp, first)
    assert (early.new_token_ids, early.text, early.finished) == (first, d.tokenizer.decode(first), False)
    assert d.early_prefix_output("r", 7, sp, [eos]) is None                      # may end it
    assert d.early_prefix_output("r", 7, SamplingParams(max_tokens=1), first) is None
    assert d.early_prefix_output("r", 7, SamplingParams(max_tokens=5, stop=("x",)), first) is None
    for e in (p, d):
        e.close()

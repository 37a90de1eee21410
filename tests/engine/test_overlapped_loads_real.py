"""Overlapped L3 loads on the real engine and a real Mooncake store: while a handed-off
prompt's KV is on its way the running request keeps decoding, and both answers are the
ones a single engine gives."""

import threading

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.sequence import SamplingParams, SeqStatus
from warmpath.engine.tiered_kv import TierConfig
from warmpath.kv.mooncake_store import MooncakeConfig

G = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def ids(tok, text, n):
    got = tok.encode(text * 200)[:n]
    assert len(got) == n
    return got


def engine(loaded, svc, overlap):
    l3 = MooncakeConfig(master=svc.master, metadata=svc.metadata, op_timeout_s=5.0, retry_after_s=0.5)
    return LLMEngine(EngineConfig(num_blocks=64, tiers=TierConfig(
        l2_gib=0.0, l3=l3, write_mode="write-through", load_mode="always", events=False,
        l3_overlap=overlap)), loaded=loaded)


def test_decodes_go_on_while_a_handed_off_prompt_loads(smollm, mooncake):
    tok = smollm.tokenizer
    p_ids = ids(tok, "Compilers turn source into machine code. ", 161)
    q_ids = ids(tok, "Tides follow the moon around the earth. ", 40)
    ref = LLMEngine(EngineConfig(num_blocks=64, enable_prefix_caching=False), loaded=smollm)
    want_p, want_q = ref.generate([p_ids], G)[0], ref.generate([q_ids], G)[0]
    p = engine(smollm, mooncake, overlap=False)
    first = p.generate([p_ids], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))[0]
    p.close()
    d = engine(smollm, mooncake, overlap=True)
    gate, real = threading.Event(), d.tiers._load_l3

    def gated(*args):   # the store is slow today: the load waits until the test lets it go
        gate.wait(30)
        return real(*args)

    d.tiers._load_l3 = gated
    got = {"q": [], "p": list(first)}
    try:
        q = d.add_request(q_ids, G)
        for o in d.step():                                   # q's prompt: its first token
            got["q"] += o.new_token_ids
        rid = d.add_request(p_ids, G, output_prefix=first)
        assert d.take_initial_output(rid).new_token_ids == first
        for _ in range(3):                                   # p loads; q goes on alone
            for o in d.step():
                assert o.request_id == q
                got["q"] += o.new_token_ids
        (loading,) = d.scheduler.loading
        assert loading.status == SeqStatus.LOADING and len(got["q"]) == 4
        gate.set()
        while d.has_work():
            for o in d.step():
                got["q" if o.request_id == q else "p"] += o.new_token_ids
    finally:
        gate.set()
        d.close()
    assert got == {"q": want_q, "p": want_p}
    # 162 tokens known at D: 10 full blocks loaded from L3, 2 tokens computed
    assert d.tiers.stats.loaded_tokens["L3"] == 160 and d.tiers.stats.load_failures == 0
    assert d.tiers.l3.stats.read_seconds > 0

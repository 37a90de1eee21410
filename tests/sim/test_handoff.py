"""``sim/handoff.py``: the PPD paper's vLLM handoff beside warmpath's, on hand-worked
timelines (every step 0.1 s, a store with no latency, as ``test_simulator.py``)."""

import dataclasses

import pytest

from tests.sim.test_simulator import FAST, STORED_64, Constant, one_turn, run, setup
from warmpath.bench.workload import Session, Turn
from warmpath.launch.topology import Topology
from warmpath.sim.handoff import PDHandoff
from warmpath.sim.hardware import MODELS

PD = Topology("pd", "pd", {"prefill": 1, "decode": 1})
KVB = MODELS["llama-3.1-8b"].kv_bytes_per_token


@pytest.mark.parametrize("handoff, ttft, e2e", [
    (PDHandoff(), 0.1, 0.4),                               # the prefill's token at 0.1
    (PDHandoff(first_token="decode"), 0.2, 0.4),           # the decode worker's first step ends at 0.2
    (PDHandoff(extra_s=0.05), 0.15, 0.45),                 # 50 ms per handoff: everything after it shifts
    (PDHandoff(extra_s=0.05, first_token="decode"), 0.25, 0.45)])
def test_where_the_first_token_comes_from(handoff, ttft, e2e):
    """64-token prompt, 4 tokens out: the prefill step ends at 0.1, the decode worker's three
    steps (the handed-off token, then two more) end 0.1, 0.2, 0.3 s after the handoff."""
    _, recs = run(setup(PD, handoff=handoff), [one_turn("a", 0.0, n=64)])
    (r,) = recs
    assert (round(r.ttft, 6), round(r.e2e, 6), r.output_tokens) == (ttft, e2e, 4)   # + a 1e15 B/s put


@pytest.mark.parametrize("recompute, cached, written_tokens", [(False, 32, 32 + 16), (True, 0, 32 + 64)])
def test_a_remote_follow_up_recomputes_the_conversation(recompute, cached, written_tokens):
    """Turn 1: 32 prompt + 17 answer tokens; its prefill writes the prompt's 2 blocks. Turn 2
    adds 16, a 65-token prompt (4 full blocks). warmpath's prefill worker reuses the prompt's
    2 blocks from its memory (the answer's block, in the store, costs more to load than to
    recompute by the load-cost rule) and writes the 1 block the store lacks; the paper's
    reuses nothing and writes all 4 under the request's own hashes."""
    s = Session("a", [Turn(list(range(1000, 1032)), 17), Turn(list(range(2000, 2016)), 2)])
    sim, recs = run(setup(PD, handoff=PDHandoff(recompute=recompute)), [s])
    assert [(r.turn, r.prompt_tokens, r.cached_tokens) for r in recs] == [(1, 32, 0), (2, 65, cached)]
    assert sim.stats.handoff_bytes == written_tokens * KVB


def test_kv_hashes_are_salted_per_request_for_follow_ups_only():
    h = PDHandoff(recompute=True)
    hashes = [bytes([i]) * 16 for i in range(3)]
    assert h.kv_hashes("s-t0", 0, hashes) is None and PDHandoff().kv_hashes("s-t1", 1, hashes) is None
    a, b = h.kv_hashes("s-t1", 1, hashes), h.kv_hashes("t-t1", 1, hashes)
    assert len(a) == 3 and all(len(x) == 16 for x in a)
    assert set(a).isdisjoint(hashes) and set(a).isdisjoint(b) and a == h.kv_hashes("s-t1", 1, hashes)


def test_named_handoffs():
    assert PDHandoff.named("warmpath") == PDHandoff()
    assert PDHandoff.named("vllm", 50) == PDHandoff(0.05, "decode", True)
    with pytest.raises(ValueError):
        PDHandoff.named("sglang")


@pytest.mark.parametrize("kw", [dict(extra_s=-0.001), dict(first_token="router")])
def test_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        PDHandoff(**kw)


class SlowPrefill(Constant):
    """0.1 s a step; a recompute priced at 100 tokens/s, so the decode worker loads the KV."""

    def prefill_tok_s(self):
        return 100.0


@pytest.mark.parametrize("overlap, a, b", [
    # a's KV load (0.25 s) and then b's stall a's decodes: a's 2nd token at 0.45, its 3rd at
    # 0.8 (0.45 + b's load + a step), then 0.9 ... 1.3; b's tokens 0.8, 0.9, 1.0
    (False, (0.1, 1.3, 0.171429), (0.1, 0.7, 0.2)),
    # beside the steps: a's load lands at 0.35 (the worker wakes then), a's tokens 0.45, 0.55
    # ... 1.05; b's load runs 0.45 -> 0.70 while a decodes, b joins the step at 0.75: 0.85 ... 1.05
    (True, (0.1, 1.05, 0.135714), (0.1, 0.75, 0.216667))])
def test_an_overlapped_handoff_load_does_not_stall_the_running_decodes(overlap, a, b):
    """PD, 0.1 s a step; each 64-token prompt's 4 stored blocks take 0.25 s to load at the
    decode worker (puts free). a (8 tokens out) at 0, b (4 out) at 0.3: b is handed off at 0.4."""
    hw = dataclasses.replace(FAST, nic_bytes_s=STORED_64 / 0.25, l3_write_bytes_s=1e15)
    s = dataclasses.replace(setup(PD, l3_overlap=overlap, store_bytes_s=1e15), hardware=hw,
                            step_time=SlowPrefill(0.1))
    _, recs = run(s, [one_turn("a", 0.0, n=64, out=8), one_turn("b", 0.3, n=64, out=4, seed=500)])
    got = [(round(r.ttft, 6), round(r.e2e, 6), round(r.tpot, 6)) for r in recs]
    assert got == [a, b]

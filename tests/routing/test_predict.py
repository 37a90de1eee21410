"""Predicted TTFT and TPOT of the candidate paths (routing/predict.py), hand-worked.

The step model: decode = 0.010 + 0.001·b; mixed = 0.010 + 0.0001·t + 0.001·b; prefill alone
= 0.005 + 0.0001·t (no context terms, so every number below is worked by hand).
"""

from dataclasses import replace

import pytest

from warmpath.engine.step_model import StepModel
from warmpath.routing.latency import RouterModel
from warmpath.routing.predict import (UNCHUNKED, ChunkScaled, Chunks, LineSteps, chunk_of, chunked, current_tpot,
                                     decode_steps_s,
                                     predict_local, predict_remote, step_cost, tpot_scale)
from warmpath.routing.views import PrefixHit, RequestView, Snapshot, WorkerView

SM = StepModel((0.005, 0.0001, 0.0), (0.010, 0.001, 0.0), mixed_coef=(0.010, 0.0001, 0.0, 0.001, 0.0),
               mixed_rows=10)


def snap(workers, hits=None, model=None):
    return Snapshot(workers, hits or {}, kv_bytes_per_token=0, model=model)


def req(n=1000, turn=1, max_tokens=100):
    return RequestView(n, (), 16, "s", turn, max_tokens=max_tokens)


def test_chunked_prices_each_chunk_as_a_mixed_step():
    # 1000 tokens beside 4 decodes: 508 then 492 tokens -> 0.0648 + 0.0632
    c = chunked(SM, 4, 1000, 1000, 0, 512)
    assert c.steps == 2 and c.total_s == pytest.approx(0.128)
    assert c.first_s(1) == pytest.approx(0.064) and c.first_s(5) == pytest.approx(0.128)
    assert chunked(SM, 4, 1000, 0, 0, 512) == Chunks()
    # alone (no decodes): the prefill line, 0.005 + 0.0001 * 200
    assert chunked(SM, 0, 0, 200, 0, 512).total_s == pytest.approx(0.025)


def test_local_prefill_stretches_the_running_decodes():
    dw = WorkerView("d0", "decode", chunk_tokens=512, running=4, running_tokens=4000)
    p = predict_local(dw, req(), snap([dw]), SM)
    assert (p.path, p.prefill, p.decode, p.running, p.cached_tokens) == ("local", None, "d0", 4, 0)
    assert p.ttft_s == pytest.approx(0.128)                     # two mixed steps
    assert p.tpot_s == pytest.approx(0.015)                     # then 5 decode: 0.010 + 0.005
    assert p.running_tpot_s == pytest.approx((0.128 + 98 * 0.015) / 100)   # 0.01598


def test_remote_leaves_the_decode_batch_one_larger_only():
    dw = WorkerView("d0", "decode", chunk_tokens=512, running=4, running_tokens=4000)
    pw = WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=1000)
    p = predict_remote(pw, dw, req(), snap([pw, dw]), SM)
    assert (p.path, p.prefill, p.decode) == ("warm", "p0", "d0")
    # the prior line: 1000·(1 + 500/8192) work units at 1000/s, + the write-through's 2 ms overhead
    assert p.ttft_s == pytest.approx(1000 * (1 + 500 / 8192) / 1000 + 0.002)
    assert p.tpot_s == pytest.approx(0.015) and p.running_tpot_s == pytest.approx(0.015)
    assert predict_remote(WorkerView("c0", "pre-prefill", chunk_tokens=512), dw, req(), snap([dw]), SM).path == "cold"


def test_queued_prompts_on_the_decode_worker_go_first():
    dw = WorkerView("d0", "decode", chunk_tokens=512, queued_prefill_tokens=508, running=4, running_tokens=4000)
    p = predict_local(dw, req(), snap([dw]), SM)
    assert p.ttft_s == pytest.approx(0.0648 + 0.128)
    assert p.running_tpot_s == pytest.approx((0.0648 + 0.128 + 97 * 0.015) / 100)
    r = predict_remote(WorkerView("p0", "prefill", chunk_tokens=512), dw, req(), snap([dw]), SM)
    assert r.running_tpot_s == pytest.approx((0.0648 + 99 * 0.015) / 100)
    assert current_tpot(SM, dw, 100) == pytest.approx((0.0648 + 99 * 0.014) / 100)
    assert current_tpot(SM, WorkerView("d1", "decode", chunk_tokens=512), 100) == 0.0


def test_cached_prefix_is_not_computed_locally():
    dw = WorkerView("d0", "decode", chunk_tokens=512, running=4, running_tokens=4000)
    p = predict_local(dw, req(1000, turn=2), snap([dw], {"d0": PrefixHit(local_blocks=56)}), SM)
    # 896 cached (L1, free): 104 tokens in one mixed step 0.010 + 0.0104 + 0.004
    assert p.cached_tokens == 896 and p.ttft_s == pytest.approx(0.0244)


def test_step_cost_prefers_the_workers_then_the_fleets_then_the_learnt_line_and_scales_online():
    w = WorkerView("d0", "decode", chunk_tokens=512, prefill_tok_s=800)
    assert step_cost(snap([w]), w) == LineSteps(0.0, 800)          # the heartbeat's line, no overhead
    ls = LineSteps(0.01, 800)
    assert ls.step_s([(1, 0)] * 4) == pytest.approx(0.01 + 16 / 800)          # the floor
    assert ls.step_s([(400, 0)]) == pytest.approx(0.01 + 400 * (1 + 200 / 8192) / 800)
    assert ls.step_s([(1, 0)] * 20 + [(400, 0)]) == pytest.approx(0.01 + (20 + 400 * (1 + 200 / 8192)) / 800)
    assert ls.step_s([(1, 0)] * 2 + [(8, 0)]) == pytest.approx(0.01 + (16 + 8 * (1 + 4 / 8192)) / 800)
    assert ls.step_s([(8, 0)]) == pytest.approx(0.01 + 8 * (1 + 4 / 8192) / 800)   # a prefill alone: no floor
    assert ls.step_s([]) == 0.0
    m = RouterModel(steps={None: SM})
    assert step_cost(snap([w], model=m), w) is SM
    m.steps["d0"] = LineSteps(0.0, 100)
    assert step_cost(snap([w], model=m), w) == LineSteps(0.0, 100)
    # measured twice the predicted: the correction moves to 2, the error is 50% of measured
    assert m.observe_tpot("d0", 0.01, 0.02) == pytest.approx(0.5)
    assert tpot_scale(snap([w], model=m), w) == pytest.approx(2.0)
    assert tpot_scale(snap([w]), w) == 1.0
    # it scales the decode steps of the TPOTs, never the chunks, never the TTFT
    dw = WorkerView("d0", "decode", chunk_tokens=512, running=4, running_tokens=4000)
    p = predict_local(dw, req(), snap([dw]), SM, k=2.0)
    assert (p.ttft_s, p.tpot_s, p.tpot_parts) == (pytest.approx(0.128), pytest.approx(0.030), (0.0, pytest.approx(0.015)))
    assert p.running_tpot_s == pytest.approx((0.128 + 2 * 98 * 0.015) / 100)
    assert m.params()["tpot_error_n"] == 1 and m.params()["tpot_scale"] == {"d0": 2.0}
    assert m.observe_tpot("d0", 0.0, 0.02) is None


def test_the_load_book_tracks_running_contexts_for_the_views():
    from warmpath.routing.load import LoadBook

    book = LoadBook()
    book.add("d0", running=1, context=1064)
    book.add("d0", running=1, context=2032)
    (v,) = book.views([WorkerView("d0", "decode", chunk_tokens=512, running=9, running_tokens=5)], 0.0)
    assert (v.running, v.running_tokens) == (2, 3096)     # the router's own count, not the heartbeat's
    book.add("d0", running=-1, context=-1064)
    assert book.of("d0").context_tokens == 2032
    book.add("d0", running=-1, context=-2032)
    book.add("d0", running=-1, context=-7)                 # a stray end never goes below zero
    assert (book.of("d0").running, book.of("d0").context_tokens) == (0, 0)


def test_without_a_step_model_local_is_priced_as_remote_less_the_handoff():
    dw, pw = WorkerView("d0", "decode", chunk_tokens=512, prefill_tok_s=1000), WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=1000)
    sn = snap([pw, dw])
    local = predict_local(dw, req(), sn, step_cost(sn, dw), chunk=2048)
    remote = predict_remote(pw, dw, req(), sn, step_cost(sn, dw), chunk=2048)
    assert local.ttft_s == pytest.approx(1000 * (1 + 500 / 8192) / 1000)      # one chunk on the same line
    assert remote.ttft_s == pytest.approx(local.ttft_s + 0.002)              # + the write-through's overhead
    # in two chunks: the same work (work() sums over chunks exactly) and one more step's overhead (0 here)
    assert predict_local(dw, req(), sn, step_cost(sn, dw), chunk=500).ttft_s == pytest.approx(local.ttft_s)


def test_chunks_after_drop_the_steps_done_by_then():
    c = Chunks(4, 8.0)                      # 2 s each
    assert c.after(0.0) == c and c.after(1.9) == c
    assert c.after(2.5) == Chunks(3, 6.0)   # one done, the second under way: still to run
    assert c.after(100.0) == Chunks(0, 0.0) and Chunks().after(3.0) == Chunks()


def test_a_remote_request_pays_the_queued_chunks_left_when_its_first_token_comes():
    # a document (1016 tokens) prefilling on d0 beside 4 decodes: 2 mixed steps of 0.0648
    dw = WorkerView("d0", "decode", chunk_tokens=512, queued_prefill_tokens=1016, running=4, running_tokens=4000)
    fast = WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=15000)
    p = predict_remote(fast, dw, req(), snap([fast, dw]), SM)
    # TTFT 1061.035 work units / 15000 + 2 ms = 0.072736 s: one step done, one left
    assert p.ttft_s == pytest.approx(1000 * (1 + 500 / 8192) / 15000 + 0.002)
    assert p.tpot_parts == (pytest.approx(0.0648 / 100), pytest.approx(99 * 0.015 / 100))
    assert p.tpot_s == pytest.approx((0.0648 + 99 * 0.015) / 100)           # 0.015498
    assert p.running_tpot_s == pytest.approx((0.1296 + 98 * 0.015) / 100)   # both steps
    # κ = 2 scales the decode steps only
    assert predict_remote(fast, dw, req(), snap([fast, dw]), SM, k=2.0).tpot_s == \
        pytest.approx((0.0648 + 2 * 99 * 0.015) / 100)
    # a slow prefill (1.063 s): the document is done before the first token
    slow = WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=1000)
    assert predict_remote(slow, dw, req(), snap([slow, dw]), SM).tpot_s == pytest.approx(0.015)


def test_the_correction_learns_the_decode_steps_and_shrugs_off_a_stretched_answer():
    m = RouterModel()
    w = WorkerView("d0", "decode", chunk_tokens=512)
    # predicted 0.02 = 0.005 of chunks + 0.015 of decode steps; measured 0.03: κ = 0.025 / 0.015
    assert m.observe_tpot("d0", 0.02, 0.03, (0.005, 0.015)) == pytest.approx(1 / 3)
    assert tpot_scale(snap([w], model=m), w) == pytest.approx(5 / 3)
    m.observe_tpot("d0", 0.02, 0.02, (0.005, 0.015))      # κ sample 1
    m.observe_tpot("d0", 0.02, 0.5, (0.005, 0.015))       # stretched by later prompts: 33, capped at 4
    assert tpot_scale(snap([w], model=m), w) == pytest.approx(5 / 3)   # the median of (5/3, 1, 4)
    for _ in range(16):                                   # the window holds the last 16
        m.observe_tpot("d0", 0.02, 0.02, (0.005, 0.015))
    assert tpot_scale(snap([w], model=m), w) == pytest.approx(1.0)
    assert m.params()["tpot_scale"] == {"d0": 1.0} and m.params()["tpot_error_n"] == 19


def test_rho_prices_the_prompt_steps_from_local_prefills_on_an_idle_decode_worker():
    m = RouterModel(steps={None: SM})                 # hop prior 0.005 s
    idle = WorkerView("d0", "decode", chunk_tokens=512)
    # alone: 512 + 488 tokens on the prefill line, 0.0562 + 0.0538
    p = predict_local(idle, req(), snap([idle], model=m), step_cost(snap([idle], model=m), idle))
    assert p.ttft_s == pytest.approx(0.005 + 0.11) and p.ttft_parts == (0.005, pytest.approx(0.11))
    # it took 0.06 s: ρ = (0.06 - 0.005) / 0.11 = 0.5, from the third sample on (the first, a
    # cold engine's 1 s: 4, capped; the median of (4, 0.5, 0.5))
    m.observe_local_ttft("d0", 0.005, 0.11, 1.0)
    m.observe_local_ttft("d0", 0.005, 0.11, 0.06)
    assert step_cost(snap([idle], model=m), idle) is SM
    m.observe_local_ttft("d0", 0.005, 0.11, 0.06)
    cost = step_cost(snap([idle], model=m), idle)
    assert cost == ChunkScaled(SM, pytest.approx(0.5))
    assert cost.step_s([(1, 0)] * 4) == pytest.approx(0.014)                 # decodes as they were
    assert cost.step_s([(1, 0)] * 4 + [(508, 0)]) == pytest.approx(0.0324)   # a chunk at half price
    p = predict_local(idle, req(), snap([idle], model=m), cost)
    assert p.ttft_s == pytest.approx(0.06) and p.ttft_parts == (0.005, pytest.approx(0.11))   # before ρ
    assert m.params()["chunk_scale"] == {"d0": 0.5}
    # beside running decodes (a step in flight to wait for) or queued prompts (progress unknown):
    # priced with ρ, no sample from it
    dw = WorkerView("d0", "decode", chunk_tokens=512, running=4, running_tokens=4000)
    p = predict_local(dw, req(), snap([dw], model=m), cost)
    assert p.ttft_s == pytest.approx(0.005 + 0.064) and p.ttft_parts is None
    assert p.running_tpot_s == pytest.approx((0.064 + 98 * 0.015) / 100)
    busy = WorkerView("d0", "decode", chunk_tokens=512, queued_prefill_tokens=508)
    assert predict_local(busy, req(), snap([busy], model=m), cost).ttft_parts is None
    m.observe_local_ttft("d0", 0.005, 0.0, 1.0)         # nothing computed: nothing learnt
    m.observe_local_ttft("d0", 0.005, 0.04, 0.2)        # steps 0.04 of 0.045 < 90%: overhead-bound
    assert m.chunk_scale["d0"].samples == 3


def test_a_handed_off_prompt_stalls_its_decode_worker_while_it_loads_what_that_worker_lacks():
    # 1000 tokens = 62 whole blocks (992 tokens) in the store; d0 holds 20 of them (320 tokens):
    # 672 tokens x 1000 bytes = 672 KB at the prior L3 line (2 ms + bytes / 4e8 B/s) = 0.00368 s,
    # over the answer's 100 tokens: +0.0000368 s per token for it and for the 4 running decodes
    dw = WorkerView("d0", "decode", chunk_tokens=512, running=4, running_tokens=4000)
    pw = WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=1000)
    hits = {"d0": PrefixHit(local_blocks=20)}
    sn = Snapshot([pw, dw], hits, kv_bytes_per_token=1000)
    p = predict_remote(pw, dw, req(), sn, SM)
    stall = (0.002 + 672_000 / 4e8) / 100
    assert p.tpot_s == pytest.approx(0.015 + stall) and p.running_tpot_s == pytest.approx(0.015 + stall)
    assert p.tpot_parts == (pytest.approx(stall), pytest.approx(0.015))
    # d0 holding the whole prompt: nothing to load, as before
    full = Snapshot([pw, dw], {"d0": PrefixHit(local_blocks=63)}, kv_bytes_per_token=1000)
    assert predict_remote(pw, dw, req(), full, SM).tpot_s == pytest.approx(0.015)
    # a local path loads nothing from a handoff
    assert predict_local(dw, req(), Snapshot([dw], hits, kv_bytes_per_token=1000), SM).tpot_s == pytest.approx(0.015)
    # a decode worker whose loads run beside its steps: the same wait for this request's second
    # token, none for the running decodes
    ov = replace(dw, overlaps_loads=True)
    p = predict_remote(pw, ov, req(), Snapshot([pw, ov], hits, kv_bytes_per_token=1000), SM)
    assert p.tpot_s == pytest.approx(0.015 + stall) and p.running_tpot_s == pytest.approx(0.015)
    assert p.handoff_s == pytest.approx(0.002 + 672_000 / 4e8)


def test_handoffs_bound_for_the_decode_worker_stall_a_request_whose_answer_they_land_in():
    # d0: 4 decodes at 1000 tokens. Locally the 1000-token prompt takes 0.0648 + 0.0632 = 0.128 s
    # (two chunks beside the 4 decodes), then 100 decode steps. Handoffs bound for d0 land at
    # 0.05 s (before its first token: no stall, but one decode more from the start), 0.5 s (0.3 s
    # of KV load: +0.003 s per token; a decode more after it) and 2.0 s (after its answer).
    # Steps: 6 decodes (0.016 s) from 0.128 s until 0.5: ceil(0.372 / 0.016) = 24 steps, then the
    # 76 left at 7 (0.017 s): 0.384 + 1.292 = 1.676 s, 0.01676 per token.
    dw = WorkerView("d0", "decode", chunk_tokens=512, running=4, running_tokens=4000,
                    incoming=((0.05, 0.2), (0.5, 0.3), (2.0, 0.4)))
    sn = Snapshot([dw], {"d0": PrefixHit()}, kv_bytes_per_token=1000)
    p = predict_local(dw, req(), sn, SM)
    assert p.ttft_s == pytest.approx(0.128)
    assert p.tpot_s == pytest.approx(0.003 + 0.01676) and p.tpot_parts == (pytest.approx(0.003), pytest.approx(0.01676))
    # the running decodes: the two chunks, then 98 of those steps (none of the loads: this path's harm only)
    assert p.running_tpot_s == pytest.approx((0.128 + 98 * 0.01676) / 100)
    # a landing predicted within 10% before its first token may come after it: its load counted;
    # landed by then, it decodes beside this one all along (6 decodes: 0.016)
    near = replace(dw, incoming=((0.9 * 0.128 + 1e-6, 0.2),))
    assert predict_local(near, req(), sn, SM).tpot_s == pytest.approx(0.016 + 0.002)
    # handed off instead (d0 holds the whole prompt: no load of its own): its first token comes
    # back at the prefill worker's TTFT t = 1.0655 s; handoffs landing at 0.95 t and t + 0.1 stall
    # it, one at 0.8 t not. Decodes: 5 + the two landed before t = 7 (0.017 s) for ceil(0.1 /
    # 0.017) = 6 steps, then 8 (0.018 s) for 94: (0.102 + 1.692) / 100 = 0.01794 per token
    pw = WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=1000)
    full = {"d0": PrefixHit(local_blocks=63)}
    t = predict_remote(pw, replace(dw, incoming=()), req(), Snapshot([pw, dw], full, kv_bytes_per_token=1000), SM).ttft_s
    dw2 = replace(dw, incoming=((0.8 * t, 0.5), (0.95 * t, 0.1), (t + 0.1, 0.3)))
    p = predict_remote(pw, dw2, req(), Snapshot([pw, dw2], full, kv_bytes_per_token=1000), SM)
    assert p.tpot_s == pytest.approx(0.004 + 0.01794) and p.handoff_s == 0.0
    # the running decodes from now: 5 decodes (0.015 s) until 0.8 t = 0.8524: 57 steps to 0.855;
    # 6 (0.016) until 0.95 t = 1.0122: 10 steps to 1.015; 7 (0.017) until t + 0.1 = 1.1655: 9 steps;
    # 8 (0.018) for the 24 left: (0.855 + 0.16 + 0.153 + 0.432) / 100 = 0.016 (their stalls not this path's)
    assert p.running_tpot_s == pytest.approx(0.016)
    # lacking 672 tokens of it (20 of 62 blocks held): its own load is what it hands d0 to pay
    part = Snapshot([pw, dw2], {"d0": PrefixHit(local_blocks=20)}, kv_bytes_per_token=1000)
    assert predict_remote(pw, dw2, req(), part, SM).handoff_s == pytest.approx(0.002 + 672_000 / 4e8)
    # loads beside the steps: the handoffs landing in its answer stall only their own requests
    # (their decodes join the batch all the same)
    ov = replace(dw, overlaps_loads=True)
    assert predict_local(ov, req(), Snapshot([ov], {"d0": PrefixHit()}, kv_bytes_per_token=1000),
                         SM).tpot_s == pytest.approx(0.01676)
    ov2 = replace(dw2, overlaps_loads=True)
    assert predict_remote(pw, ov2, req(), Snapshot([pw, ov2], full, kv_bytes_per_token=1000),
                          SM).tpot_s == pytest.approx(0.01794)


def test_decode_steps_grow_as_handoffs_land():
    # 2 decodes; one handoff landed already (at 0: 3 decodes, 0.013 s a step), one at 0.05 s:
    # ceil(0.05 / 0.013) = 4 steps before it, then 4 decodes (0.014 s) for the 6 left
    got = decode_steps_s(SM, 2, 1000, ((0.0, 0.0), (0.05, 0.3)), 0.0, 10)
    assert got == pytest.approx((4 * 0.013 + 6 * 0.014) / 10)
    assert decode_steps_s(SM, 2, 1000, (), 0.0, 10) == pytest.approx(0.012)
    # one landing after the answer ends changes nothing; from 0.2 s on, both have landed
    assert decode_steps_s(SM, 2, 1000, ((5.0, 0.0),), 0.0, 10) == pytest.approx(0.012)
    assert decode_steps_s(SM, 2, 1000, ((0.0, 0.0), (0.05, 0.0)), 0.2, 10) == pytest.approx(0.014)


def test_a_prompt_is_chunked_as_the_worker_that_computes_it_registered():
    """The chunk is the decode worker's own (its --max-num-batched-tokens: 512 on ours, 2,048 on
    vLLM's), not one number for the fleet: a 1,000-token prompt beside 4 decodes is 2 mixed steps
    of 508 + 492 tokens at 512, one step at 2,048; a worker that registered none computes it in one."""
    busy = dict(running=4, running_tokens=4000)
    ours, vllm = WorkerView("d0", "decode", chunk_tokens=512, **busy), WorkerView("d0", "decode", chunk_tokens=2048, **busy)
    two = predict_local(ours, req(), snap([ours]), SM)
    one = predict_local(vllm, req(), snap([vllm]), SM)
    # mixed step = 0.010 + 0.0001·t + 0.001·4: 0.0648 + 0.0632 in two chunks, 0.114 in one
    assert two.ttft_s == pytest.approx(0.0648 + 0.0632)
    assert one.ttft_s == pytest.approx(0.114)
    assert predict_local(ours, req(), snap([ours]), SM, chunk=2048).ttft_s == pytest.approx(one.ttft_s)
    unknown = WorkerView("d0", "decode", **busy)
    assert predict_local(unknown, req(), snap([unknown]), SM).ttft_s == pytest.approx(one.ttft_s)
    assert (chunk_of(ours), chunk_of(vllm), chunk_of(unknown, 256), chunk_of(unknown)) == (512, 2048, 256, UNCHUNKED)

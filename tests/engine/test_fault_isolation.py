"""One request's fault inside a step fails that request alone (real SmolLM2, real engine);
an error no request caused stops the engine thread and tells every waiting request."""

import asyncio

import pytest

from warmpath.engine.async_engine import AsyncEngine, EngineFailed, RequestFailed
from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.sequence import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
POISON = SamplingParams(max_tokens=12, temperature=0.8, seed=4242, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(smollm):
    tok = smollm.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]))
            for t in ("What is the capital of France?", "Name a prime number. " * 5, "Say hi. " * 9)]


def engine(smollm) -> LLMEngine:
    return LLMEngine(EngineConfig(num_blocks=256), loaded=smollm)


def run(eng: LLMEngine, reqs: dict) -> dict:
    """Add ``{rid: (prompt, params)}``, step until idle; ``{rid: (tokens, error)}``."""
    for rid, (p, sp) in reqs.items():
        eng.add_request(p, sp, request_id=rid)
    out = {rid: ([], None) for rid in reqs}
    while eng.has_work():
        for o in eng.step():
            toks, _ = out[o.request_id]
            out[o.request_id] = (toks + o.new_token_ids, o.error)
    return out


def test_a_step_fault_fails_one_request_and_the_batch_goes_on(smollm, prompts):
    alone = run(engine(smollm), {"a": (prompts[0], GREEDY), "c": (prompts[2], GREEDY)})
    eng = engine(smollm)
    free0 = eng.pool.num_free
    eng.runner.sampler.fail_seeds.add(4242)
    got = run(eng, {"a": (prompts[0], GREEDY), "bad": (prompts[1], POISON), "c": (prompts[2], GREEDY)})
    assert got["bad"][0] == [] and "injected sampler fault (seed 4242)" in got["bad"][1]
    assert got["a"] == alone["a"] and got["c"] == alone["c"]          # same 12 greedy tokens each
    assert len(got["a"][0]) == 12 and got["a"][1] is None
    assert eng.request_ids() == [] and not eng.has_work()
    # the failed request's blocks went back: only prefix-cached (evictable) blocks remain
    assert eng.pool.num_free == free0
    eng.pool.check_integrity()
    assert run(eng, {"again": (prompts[0], GREEDY)})["again"] == alone["a"]


def test_a_fault_on_a_later_decode_step_frees_the_request(smollm, prompts):
    eng = engine(smollm)
    free0 = eng.pool.num_free
    eng.add_request(prompts[1], POISON, request_id="bad")
    eng.add_request(prompts[0], GREEDY, request_id="a")
    for _ in range(4):    # prefill and a few decode steps, then the fault strikes
        eng.step()
    eng.runner.sampler.fail_seeds.add(4242)
    outs = eng.step()
    failed = [o for o in outs if o.error]
    assert [o.request_id for o in failed] == ["bad"] and failed[0].finished and failed[0].finish_reason == "error"
    while eng.has_work():
        eng.step()
    assert eng.request_ids() == [] and eng.pool.num_free == free0
    eng.pool.check_integrity()


def test_async_engine_delivers_request_failed_and_survives(smollm, prompts):
    async def main():
        ae = AsyncEngine(engine(smollm))
        ae.start()
        ae.engine.runner.sampler.fail_seeds.add(4242)
        try:
            bad = ae.add_request("bad", prompts[1], POISON)
            good = ae.add_request("good", prompts[0], GREEDY)
            item = await asyncio.wait_for(bad.queue.get(), 60)
            assert isinstance(item, RequestFailed)
            n = 0
            while True:
                o = await asyncio.wait_for(good.queue.get(), 60)
                n += len(o.new_token_ids)
                if o.finished:
                    break
            assert n == 12 and ae.alive and not ae.dead.is_set()
        finally:
            ae.shutdown()

    asyncio.run(main())


def test_engine_crash_fails_every_waiting_request_and_sets_dead(smollm, prompts):
    async def main():
        ae = AsyncEngine(engine(smollm))
        ae.start()
        try:
            h = ae.add_request("r", prompts[0], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
            await asyncio.wait_for(h.queue.get(), 60)     # it is running
            ae.inject_crash()
            await asyncio.wait_for(ae.dead.wait(), 30)
            while True:
                item = await asyncio.wait_for(h.queue.get(), 30)
                if isinstance(item, Exception):
                    break
            assert isinstance(item, EngineFailed) and "injected engine crash" in str(item)
            assert not ae.alive
        finally:
            ae.shutdown()

    asyncio.run(main())

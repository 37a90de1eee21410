"""Greedy output must not depend on how the prefix was obtained or batched (real SmolLM2)."""

import json
import time

import pytest

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
TEXTS = [
    "What is the capital of France?",
    "Write a short poem about caches and memory. " * 6,
    "def fibonacci(n):\n    " * 12,
    "List three prime numbers and explain why they are prime. " * 10,
]


def engine(loaded, budget=4096, chunked=True, caching=True, blocks=512, max_seqs=64):
    return LLMEngine(EngineConfig(num_blocks=blocks, enable_prefix_caching=caching,
                                  scheduler=SchedulerConfig(max_num_batched_tokens=budget,
                                                            enable_chunked_prefill=chunked,
                                                            max_num_seqs=max_seqs)), loaded=loaded)


@pytest.fixture(scope="module")
def prompts(smollm):
    tok = smollm.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in TEXTS]


@pytest.fixture(scope="module")
def reference(smollm, prompts):
    """Each prompt alone, no chunking, no prefix cache."""
    return [engine(smollm, chunked=False, caching=False).generate([p], GREEDY)[0] for p in prompts]


def test_lengths_are_mixed(prompts):
    lens = sorted(len(p) for p in prompts)
    assert lens[0] < 50 and lens[-1] > 120


def test_batch_of_mixed_lengths_equals_alone(smollm, prompts, reference):
    assert engine(smollm).generate(prompts, GREEDY) == reference


@pytest.mark.parametrize("budget", [16, 50, 128])
def test_chunked_prefill_equals_unchunked(smollm, prompts, reference, budget):
    assert engine(smollm, budget=budget).generate(prompts, GREEDY) == reference


def test_prefix_cache_hit_equals_recompute(smollm, prompts, reference):
    eng = engine(smollm)
    first = eng.generate(prompts, GREEDY)
    hits_before = eng.scheduler.prefix_hit_tokens
    second = eng.generate(prompts, GREEDY)
    # every prompt's full blocks but the last are reused the second time
    assert eng.scheduler.prefix_hit_tokens - hits_before == sum((len(p) - 1) // 16 * 16 for p in prompts)
    assert first == second == reference


def test_longer_prompt_reuses_shorter_prompts_blocks(smollm, prompts):
    base = prompts[3]
    longer = base + [504, 1170, 28]
    fresh = engine(smollm, caching=False).generate([longer], GREEDY)[0]
    eng = engine(smollm)
    eng.generate([base], GREEDY)
    got = eng.generate([longer], GREEDY)[0]
    assert eng.scheduler.prefix_hit_tokens == (len(longer) - 1) // 16 * 16
    assert got == fresh


def test_output_after_preemption_equals_reference(smollm, prompts, reference):
    # All prompts fit in the pool, but not their 64 generated tokens: decodes must preempt.
    long = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    blocks = sum(-(-len(p) // 16) for p in prompts) + 1
    assert blocks < sum(-(-(len(p) + 64) // 16) for p in prompts) - 8
    eng = engine(smollm, blocks=blocks, budget=1024)
    got = eng.generate(prompts, long)
    assert eng.scheduler.num_preemptions > 0
    assert got == engine(smollm).generate(prompts, long)
    assert [g[:24] for g in got] == reference
    eng.pool.check_integrity()
    assert eng.pool.num_free == blocks


def test_seeded_sampling_is_reproducible_in_any_batch(smollm, prompts):
    p = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    alone = engine(smollm).generate([prompts[0]], p)[0]
    batched = engine(smollm).generate(prompts, [p] + [SamplingParams(max_tokens=8, temperature=1.0)] * 3)[0]
    assert alone == batched


def test_penalized_greedy_does_not_depend_on_chunking_batching_or_preemption(smollm, prompts):
    """The repetition penalty's seen-token masks grow step by step; they must give what a
    fresh mask per step gives, whatever the schedule (here: alone vs chunked, batched and
    preempted), and the penalty must change the greedy answer."""
    p = SamplingParams(max_tokens=40, temperature=0, repetition_penalty=1.3, ignore_eos=True)
    alone = [engine(smollm, chunked=False, caching=False).generate([q], p)[0] for q in prompts]
    blocks = sum(-(-len(q) // 16) for q in prompts) + 1
    eng = engine(smollm, budget=16, blocks=blocks)
    assert eng.generate(prompts, p) == alone and eng.scheduler.num_preemptions > 0
    plain = engine(smollm).generate(prompts, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    assert plain != alone
    assert eng.runner.sampler._seen == {}      # released with their requests


def test_stop_token_ids_and_eos(smollm, prompts):
    eng = engine(smollm)
    ref = eng.generate([prompts[0]], GREEDY)[0]
    stop_at = ref[3]
    got = eng.generate([prompts[0]], SamplingParams(max_tokens=24, temperature=0,
                                                    stop_token_ids=(stop_at,)))[0]
    assert got == ref[:ref.index(stop_at) + 1]


def test_busy_seconds_count_only_steps_with_work(smollm, prompts, tmp_path):
    trace = tmp_path / "steps.jsonl"
    eng = LLMEngine(EngineConfig(num_blocks=512, step_trace=str(trace),
                                 scheduler=SchedulerConfig(max_num_batched_tokens=16)), loaded=smollm)
    assert eng.step() == [] and eng.busy_seconds == 0.0      # nothing to do: not busy
    t0 = time.perf_counter()
    eng.generate([prompts[0]], GREEDY)
    wall = time.perf_counter() - t0
    assert 0.0 < eng.busy_seconds <= wall
    eng.close()
    steps = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(steps) == eng.num_steps
    n = len(prompts[0])
    # chunks of 16 tokens over a growing context, then one token per step after the prompt
    assert [s["items"] for s in steps[:2]] == [[[16, 0]], [[16, 16]]]
    assert steps[-1]["items"] == [[1, n + GREEDY.max_tokens - 2]]
    assert all(s["t0"] <= s["t1"] and 0 < s["exec_s"] <= s["t1"] - s["t0"] for s in steps)


def test_former_gather_attention_answers_as_the_paged_default(smollm, prompts, reference):
    eng = LLMEngine(EngineConfig(num_blocks=512, attention="gather"), loaded=smollm)
    assert eng.generate(prompts, GREEDY) == reference

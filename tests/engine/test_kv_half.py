"""``--kv-dtype float16`` under the float32 model (real SmolLM2, real Mooncake): half the KV bytes
in every tier, and greedy output still independent of batching, chunking and where the prefix
came from (prefill attends over its own K/V rounded as the cache holds them)."""

import pytest

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.engine.tiered_kv import TierConfig
from warmpath.kv.mooncake_store import MooncakeConfig
from tests.engine.test_engine_greedy_equivalence import prompts  # noqa: F401 (the fixture)

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def engine(loaded, kv="float16", budget=4096, chunked=True, caching=True, blocks=512, tiers=None):
    return LLMEngine(EngineConfig(num_blocks=blocks, enable_prefix_caching=caching, kv_dtype=kv, tiers=tiers,
                                  scheduler=SchedulerConfig(max_num_batched_tokens=budget,
                                                            enable_chunked_prefill=chunked)), loaded=loaded)


@pytest.fixture(scope="module")
def reference(smollm, prompts):
    """float16 KV, each prompt alone, no chunking, no prefix cache."""
    eng = engine(smollm, chunked=False, caching=False)
    return [eng.generate([p], GREEDY)[0] for p in prompts]


def test_the_cache_and_every_count_of_its_bytes_are_half(smollm):
    half, full = engine(smollm, blocks=64), engine(smollm, kv="auto", blocks=64)
    assert half.runner.kv_caches.dtype.itemsize == 2 and full.runner.kv_caches.dtype.itemsize == 4
    assert half.runner.kv_caches.shape == full.runner.kv_caches.shape
    assert half.namespace.dtype == "float16" and full.namespace.dtype == "float32"
    # KV of float16 and float32 never share a key (a block of one is never read as the other)
    assert half.namespace.digest != full.namespace.digest
    # SmolLM2: 30 layers x 2 x 3 KV heads x 64 x 2 bytes
    assert smollm.config.kv_bytes_per_token(half.runner.kv_dtype.itemsize) == 23040


def test_greedy_output_is_the_float32_caches_on_the_first_tokens(smollm, prompts, reference):
    # rounding K/V to half moves logits by ~1e-3; on these prompts the first 8 tokens keep
    full = engine(smollm, kv="auto", chunked=False, caching=False)
    for p, want in zip(prompts, reference):
        assert full.generate([p], GREEDY)[0][:8] == want[:8]


def test_batched_chunked_and_cached_equal_alone(smollm, prompts, reference):
    assert engine(smollm).generate(prompts, GREEDY) == reference
    assert engine(smollm, budget=16).generate(prompts, GREEDY) == reference
    eng = engine(smollm, budget=50)
    assert eng.generate(prompts, GREEDY) == reference
    before = eng.scheduler.prefix_hit_tokens
    assert eng.generate(prompts, GREEDY) == reference                 # the prefixes from L1
    assert eng.scheduler.prefix_hit_tokens - before == sum((len(p) - 1) // 16 * 16 for p in prompts)


def test_l2_and_the_store_carry_half_blocks(smollm, prompts, reference, mooncake):
    l3 = MooncakeConfig(master=mooncake.master, metadata=mooncake.metadata, op_timeout_s=1.0,
                        retry_after_s=0.5)
    tiers = TierConfig(l2_gib=0.05, l3=l3, write_mode="write-through", load_mode="always")
    a = engine(smollm, tiers=tiers)
    assert a.generate([prompts[3]], GREEDY)[0] == reference[3]
    assert a.tiers.l2.data.dtype.itemsize == 2
    b = engine(smollm, tiers=tiers)                  # a fresh engine: the prefix from the store
    assert b.generate([prompts[3]], GREEDY)[0] == reference[3]
    full_blocks = (len(prompts[3]) - 1) // 16
    assert b.tiers.stats.loaded_tokens["L3"] == full_blocks * 16
    # a stored block: header + 16 tokens x 23,040 bytes / 16 ... its payload is half a float32 one's
    assert b.tiers.block_bytes == 16 * 23040
    for e in (a, b):
        e.close()

"""The compiled decode step: buckets, its attention formulation, its cache, and (slow) the
real SmolLM2 compiled, answering as the eager engine does."""

import logging
import os

import pytest
import torch

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.models.attention import AttentionMetadata, paged_attention
from warmpath.models.compiled_step import bucket, cache_dir, decode_attention_indexed


def test_buckets_start_at_two_and_double():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 16, 17, 64, 65, 512)] == [2, 2, 4, 4, 8, 16, 32, 64, 128, 512]
    assert bucket(600) == 600     # past the last bucket: the batch itself


def test_indexed_attention_equals_gather_on_a_shuffled_ragged_cache():
    bs, h, kvh, d, nb = 4, 6, 2, 8, 40
    gen = torch.Generator().manual_seed(5)
    cache = torch.randn(2, nb, bs, kvh, d, generator=gen)
    lens = [3, 9, 16, 1]
    ids = torch.randperm(nb, generator=gen).tolist()
    tables, at = [], 0
    for n in lens:
        tables.append(ids[at:at + -(-n // bs)])
        at += len(tables[-1])
    q = torch.randn(len(lens), h, d, generator=gen)
    # the gather path writes this step's K/V; give it the rows already in the cache
    slots = [t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)]
    flat = cache.view(2, -1, kvh, d)
    k, v = flat[0, slots].clone(), flat[1, slots].clone()
    meta = AttentionMetadata.build(bs, tables, lens, [], slots, torch.device("cpu"), impl="gather")
    want = paged_attention(q, k, v, cache.clone(), meta, 0.25)
    w = max(len(t) for t in tables) + 1       # one extra padded column, masked off
    tab = torch.tensor([t + [0] * (w - len(t)) for t in tables])
    got = decode_attention_indexed(q, cache[0], cache[1], tab, torch.tensor(lens), 0.25)
    assert (got - want).abs().max().item() < 2e-6
    # one token of context: the output is its value row for every head of the group
    assert torch.equal(got[3].view(kvh, h // kvh, d)[0, 2], v[3, 0])


def test_fp16_linears_of_two_layers_share_one_graph():
    """The compiled step relies on it: the packed fp16 weights are graph inputs, not constants."""
    from torch._dynamo.testing import CompileCounter

    from warmpath.models.quant import Fp16Linear

    torch._dynamo.reset()
    a = Fp16Linear(torch.tensor([[0.5, -1.25, 2.0], [0.0, 0.75, -0.125]]), None)
    b = Fp16Linear(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 4.0]]), None)
    cnt = CompileCounter()
    f = torch.compile(lambda m, t: m(t) * 2, backend=cnt)
    x = torch.tensor([[1.0, 2.0, 3.0]])
    # a: 0.5 - 2.5 + 6 = 4 -> 8; 1.5 - 0.375 = 1.125 -> 2.25.  b: 1 -> 2; 12 -> 24
    assert f(a, x).tolist() == [[8.0, 2.25]] and f(b, x).tolist() == [[2.0, 24.0]]
    assert cnt.frame_count == 1


def test_cache_dir_defaults_under_home_and_follows_the_override(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WARMPATH_INDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")
    assert cache_dir() == str(tmp_path / ".cache" / "warmpath" / "inductor")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == cache_dir()
    monkeypatch.setenv("WARMPATH_INDUCTOR_CACHE_DIR", str(tmp_path / "x"))
    assert cache_dir() == str(tmp_path / "x") and (tmp_path / "x").is_dir()


def test_bad_compile_and_attention_values_are_named(tiny):
    with pytest.raises(ValueError, match="compile must be 'on' or 'off', got 'yes'"):
        LLMEngine(EngineConfig(model="tiny", num_blocks=8, compile="yes"), loaded=tiny)
    with pytest.raises(ValueError, match="attention must be one of .*got 'flash'"):
        LLMEngine(EngineConfig(model="tiny", num_blocks=8, attention="flash"), loaded=tiny)


@pytest.mark.slow
def test_compiled_step_answers_as_eager_alone_and_batched(served_model, caplog):
    tok = served_model.tokenizer
    prompts = [tok.encode("The capital of France is"), tok.encode("def fibonacci(n):"),
               tok.encode("Once upon a time, in a land far away, there")]
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)

    def run(**kw):
        eng = LLMEngine(EngineConfig(num_blocks=64, scheduler=SchedulerConfig(max_num_seqs=4), **kw),
                        loaded=served_model)
        return eng, eng.generate(prompts, greedy), [eng.generate([p], greedy)[0] for p in prompts]

    _, ref, _ = run(attention="gather", compile="off")
    with caplog.at_level(logging.INFO, logger="warmpath.models.compiled_step"):
        eng, batched, alone = run(compile="on")
    assert batched == ref and alone == ref
    assert tok.decode(batched[0]).startswith(" Paris.")
    assert eng.runner.compile_seconds > 0
    assert "compiled decode step:" in caplog.text and "buckets up to 4" in caplog.text

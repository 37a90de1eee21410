"""Small decode-only steps run on fewer threads than prefills (engine/model_runner.py)."""

import pytest
import torch

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.model_runner import SMALL_DECODE, decode_threads_default
from warmpath.engine.sequence import SamplingParams


def test_default_leaves_one_core_on_cpu_and_keeps_all_elsewhere():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [decode_threads_default(n, cpu) for n in (1, 2, 3, 8)] == [1, 1, 2, 7]
    assert decode_threads_default(8, cuda) == 8


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _threads_per_step(eng: LLMEngine, n_prompts: int) -> list[tuple[int, int]]:
    """(decodes scheduled, torch threads after the step) for each step until idle."""
    seen = []
    orig = eng.runner.execute

    def spy(out, *a, **k):
        res = orig(out, *a, **k)
        seen.append((sum(s.num_tokens == 1 for s in out.scheduled)
                     if all(s.num_tokens == 1 for s in out.scheduled) else -1, torch.get_num_threads()))
        return res

    eng.runner.execute = spy
    eng.generate([[1, 2, 3, 4, 5, 6]] * n_prompts, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    return seen


def test_one_sequence_decodes_on_decode_threads_and_prefills_on_all(tiny, restore_threads):
    eng = LLMEngine(EngineConfig(model="tiny", num_blocks=16, num_threads=2, decode_threads=1), loaded=tiny)
    # step 1: the prefill (-1) on 2 threads; steps 2-3: one decode each, on 1
    assert _threads_per_step(eng, 1) == [(-1, 2), (1, 1), (1, 1)]


def test_a_batch_of_small_decode_size_or_more_keeps_every_thread(tiny, restore_threads):
    eng = LLMEngine(EngineConfig(model="tiny", num_blocks=64, num_threads=2, decode_threads=1), loaded=tiny)
    steps = _threads_per_step(eng, SMALL_DECODE)
    assert steps[0] == (-1, 2) and steps[1:] == [(SMALL_DECODE, 2)] * 2


def test_bad_decode_threads_is_named(tiny):
    with pytest.raises(ValueError, match="decode_threads must be > 0, got 0"):
        LLMEngine(EngineConfig(model="tiny", num_blocks=8, decode_threads=0), loaded=tiny)

"""How much a step slows while another worker computes beside it (``warmpath calibrate``).

The simulator's CPU profile divides every running job's speed by ``1 + contention`` per
other core busy (``sim/cpu.py``): two processes on two cores share no core, only the caches
and memory. Inferred from a served run's overlapping steps (``engine/step_trace.py``'s
``trace_variation``), the figure rests on the few step shapes that happened to run both
alone and beside one other worker: two calibrations of one engine on this machine gave 0.067
and 0.148 from their 2 × 60 s served phases where two 300-s traced runs gave 0.064 and 0.072.
Here it is measured directly: a decode batch of contexts of its own is timed alone, then while
a second process (the same model, one thread) runs prefill steps, then alone again. One shape
beside a neighbour computing flat out: where a served phase ran, calibrate's default is the
served steps' own figure over the fit (``step_trace.contention_over_model``; 1.08–1.10× where
this said 1.17×, the same afternoon), and this one is kept as ``contention_measured``.

    python -m warmpath.cli calibrate ...   # writes ``contention_measured`` (and ``contention`` without a served phase)
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time

import torch

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.engine.step_timing import random_tokens
from warmpath.models.loader import LoadedModel, load_model


def _neighbour(spec: str, quantization: str, tokens: int, ready, stop, steps) -> None:
    """The other worker: prefill steps of ``tokens`` new tokens, one after another, until
    ``stop``; ``steps`` counts those that ran while the caller timed (after ``ready``)."""
    torch.set_num_threads(1)
    lm = load_model(spec, quantization=quantization, seed=0)
    vocab = lm.config.vocab_size
    eng = LLMEngine(EngineConfig(num_blocks=4 * (tokens // 16 + 2), block_size=16), loaded=lm)
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    seed = 10_000
    while not stop.is_set():
        eng.generate([random_tokens(seed := seed + 1, tokens, vocab)], one)   # a new prompt: no prefix hit
        if ready.is_set():
            steps.value += 1
        ready.set()
    eng.close()


def _decoding(lm: LoadedModel, batch: int, context: int, steps: int) -> LLMEngine:
    """An engine with ``batch`` sequences decoding, each over a context of its own."""
    vocab = lm.config.vocab_size
    per_seq = (context + steps + 40) // 16 + 2
    eng = LLMEngine(EngineConfig(num_blocks=2 * batch * per_seq, block_size=16,
                                 scheduler=SchedulerConfig(max_num_seqs=batch + 1,
                                                           max_num_batched_tokens=2 * context)), loaded=lm)
    ctxs = [random_tokens(100 + i, context, vocab) for i in range(batch)]
    eng.generate(ctxs, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    for i, c in enumerate(ctxs):
        eng.add_request(c + random_tokens(200 + i, 1, vocab),
                        SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True))
    while any(s.in_prefill for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    return eng


def _timed(eng: LLMEngine, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        eng.step()
        out.append(time.perf_counter() - t0)
    return out


def measure_contention(lm: LoadedModel, spec: str, quantization: str, batch: int = 2, context: int = 1024,
                       steps: int = 24, neighbour_tokens: int = 256, timeout_s: float = 120.0) -> dict:
    """Decode steps of ``lm`` (``batch`` × ``context``) alone, beside a process running
    ``spec``'s prefill steps, and alone again: ``contention`` = median beside / median alone
    − 1 (floored at 0). ``neighbour_steps``: the other process's steps while the middle
    ``steps`` ran (0 would mean the measurement was alone)."""
    eng = _decoding(lm, batch, context, 3 * steps)
    ctx = mp.get_context("spawn")
    ready, stop, count = ctx.Event(), ctx.Event(), ctx.Value("i", 0)
    proc = ctx.Process(target=_neighbour, args=(spec, quantization, neighbour_tokens, ready, stop, count),
                       daemon=True)
    try:
        before = _timed(eng, steps)
        proc.start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.2):
            if not proc.is_alive():
                raise RuntimeError(f"contention: the neighbour process exited ({proc.exitcode}) before its first step")
            if time.monotonic() > deadline:
                raise RuntimeError(f"contention: the neighbour process did not start in {timeout_s:.0f} s")
        beside = _timed(eng, steps)
        n = count.value
        stop.set()
        proc.join(timeout_s)
        after = _timed(eng, steps)
    finally:
        stop.set()
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        eng.close()
    alone = statistics.median(before + after)
    with_one = statistics.median(beside)
    return {"contention": max(0.0, with_one / alone - 1.0), "alone_s": alone, "beside_s": with_one,
            "neighbour_steps": n, "batch": batch, "context": context, "steps": steps}

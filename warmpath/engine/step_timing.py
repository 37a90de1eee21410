"""Measure a real engine's step times and fit a step-time model (``warmpath calibrate``).

Three kinds of step are timed on the engine as it is (model, device, threads):
* prefill of ``t`` new tokens over a cached context of ``c`` tokens;
* decode of ``b`` sequences at context ``c`` (each its own context);
* the same decode batch with an append-prefill of ``t`` tokens in the step (PPD's local path).
The fit (least squares) is ``prefill = a0 + a1·t + a2·t·c`` and
``decode = d0 + d1·b + d2·b·c``; the mixed steps are fitted on their own
(``m0 + m1·t + m2·t·c + m3·b + m4·b·c``, :func:`~warmpath.engine.step_model.fit_mixed`).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.step_model import StepProfile
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.models.loader import LoadedModel

_ONE = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def random_tokens(seed: int, n: int, vocab: int) -> list[int]:
    """``n`` seeded token ids in ``[3, vocab - 1)`` (prompts that share no prefix by chance)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, vocab - 1, n)]


def profile_engine(loaded: LoadedModel, contexts=(128, 512), tokens=(16, 64, 256), batches=(1, 4, 16),
                   decode_steps: int = 4, block_size: int = 16) -> StepProfile:
    """Time prefill, decode and mixed steps on ``loaded`` (a few seconds on the tiny model).

    Every step runs on all the process's threads (small decode steps too, which a served
    worker runs on ``decode_threads``: the step model is linear in the batch, and the thread
    switch is a serving-side remedy for contention that a step timed alone does not have)."""
    vocab = loaded.config.vocab_size
    max_ctx = max(contexts) + max(tokens) + decode_steps + 8
    per_seq = -(-max_ctx // block_size) + 1
    blocks = (max(batches) + 2) * per_seq + max(batches) * per_seq   # the decoders' own contexts, cached
    sched = SchedulerConfig(max_num_seqs=max(batches) + 2, max_num_batched_tokens=max_ctx * 2)
    prof = StepProfile()
    seed = 0
    for c in contexts:
        eng = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, block_size=block_size,
                                     decode_threads=torch.get_num_threads()), loaded=loaded)
        # each decoding sequence has a context of its own, as served ones do: a batch that
        # shared one context would read its KV once from cache where served ones read b
        # different contexts from memory (at 2,048 tokens, 8 shared decode in half the time)
        own = [random_tokens(seed := seed + 1, c, vocab) for _ in range(max(batches))]
        ctx = own[0]
        eng.generate(own, _ONE)                         # every context is now cached
        for t in tokens:
            eng.add_request(ctx + random_tokens(seed := seed + 1, t, vocab), _ONE)
            t0 = time.perf_counter()
            eng.step()
            prof.prefill.append((t + c % block_size if c % block_size else t, c, time.perf_counter() - t0))
            while eng.has_work():
                eng.step()
        for b in batches:
            for i in range(b):
                eng.add_request(own[i] + random_tokens(seed := seed + 1, 1, vocab),
                                SamplingParams(max_tokens=decode_steps + 2 + max(tokens), temperature=0,
                                               ignore_eos=True))
            eng.step()                                  # admit all (cached context + 1 token each)
            while any(s.in_prefill for s in eng.scheduler.running) or eng.scheduler.waiting:
                eng.step()
            times = []
            for _ in range(decode_steps):
                t0 = time.perf_counter()
                eng.step()
                times.append(time.perf_counter() - t0)
            prof.decode.append((b, c, float(np.median(times))))
            for t in tokens:                            # an append-prefill joins the decode batch
                eng.add_request(ctx + random_tokens(seed := seed + 1, t, vocab), _ONE)
                t0 = time.perf_counter()
                eng.step()
                prof.mixed.append((b, c, t, c, time.perf_counter() - t0))
            for rid in eng.request_ids():
                eng.abort(rid)
        eng.close()
    return prof


def answer_roundtrip_miss(loaded: LoadedModel, prompts: list[list[int]], max_tokens: int,
                          block_size: int = 16, tokenizer=None) -> float:
    """Share of greedy answers to ``prompts`` whose text, encoded again, does not give back the
    generated ids through the KV block the answer starts in: a client that sends answers back
    as text (``warmpath bench``, chat clients) loses that answer's KV on the next turn.
    ``tokenizer``: the client's (default: the model's)."""
    if not prompts:
        raise ValueError("answer_roundtrip_miss: no prompts")
    tok = tokenizer or loaded.tokenizer
    ks = [block_size - len(p) % block_size for p in prompts]   # answer tokens in its first block
    blocks = len(prompts) * (-(-(max(map(len, prompts)) + max_tokens) // block_size) + 1)
    eng = LLMEngine(EngineConfig(num_blocks=blocks, block_size=block_size,
                                 scheduler=SchedulerConfig(max_num_seqs=len(prompts),
                                                           max_num_batched_tokens=8192)), loaded=loaded)
    try:
        answers = eng.generate([list(p) for p in prompts], SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    finally:
        eng.close()
    miss = 0
    for k, ids in zip(ks, answers):
        miss += tok.encode(tok.decode(ids), add_special=False)[:k] != ids[:k]
    return miss / len(prompts)

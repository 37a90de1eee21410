"""Measure a real engine's step times and fit a step-time model (``warmpath calibrate``).

Three kinds of step are timed on the engine as it is (model, device, threads):
* prefill of ``t`` new tokens over a cached context of ``c`` tokens;
* decode of ``b`` sequences at context ``c``;
* the same decode batch with an append-prefill of ``t`` tokens in the step (PPD's local path).
The fit (least squares) is ``prefill = a0 + a1·t + a2·t·c`` and
``decode = d0 + d1·b + d2·b·c``; the mixed step is modelled as decode + prefill − a0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.step_model import StepModel, fit_linear
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.models.loader import LoadedModel

_ONE = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


@dataclass
class StepProfile:
    prefill: list[tuple[int, int, float]] = field(default_factory=list)     # (tokens, context, s)
    decode: list[tuple[int, int, float]] = field(default_factory=list)      # (batch, context, s)
    mixed: list[tuple[int, int, int, float]] = field(default_factory=list)  # (batch, ctx, tokens, s)

    def fit(self) -> StepModel:
        return StepModel(fit_linear(self.prefill), fit_linear(self.decode))

    def extend(self, other: "StepProfile") -> "StepProfile":
        """This profile's rows plus ``other``'s."""
        return StepProfile(self.prefill + other.prefill, self.decode + other.decode, self.mixed + other.mixed)


def read_step_trace(path) -> dict[str, list[dict]]:
    """A ``--step-trace`` file, or a folder of them → each worker's steps (by file name)."""
    import json
    from pathlib import Path

    path = Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    return {f.stem: [json.loads(x) for x in f.read_text().splitlines() if x] for f in files}


def profile_from_trace(steps) -> StepProfile:
    """Rows from a server's step trace (``--step-trace``): one-sequence prefill steps and pure
    decode steps, timed without their KV-tier work (the simulator charges that separately);
    mixed and multi-prefill steps are left out."""
    prof = StepProfile()
    for s in steps:
        items = s["items"]
        t = s["t1"] - s["t0"] - s.get("tiers_s", 0.0)
        if not items or t <= 0:
            continue
        if all(n == 1 for n, _ in items):
            prof.decode.append((len(items), sum(c for _, c in items) // len(items), t))
        elif len(items) == 1:
            prof.prefill.append((items[0][0], items[0][1], t))
    return prof


def _tokens(seed: int, n: int, vocab: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, vocab - 1, n)]


def profile_engine(loaded: LoadedModel, contexts=(128, 512), tokens=(16, 64, 256), batches=(1, 4, 16),
                   decode_steps: int = 4, block_size: int = 16) -> StepProfile:
    """Time prefill, decode and mixed steps on ``loaded`` (a few seconds on the tiny model)."""
    vocab = loaded.config.vocab_size
    max_ctx = max(contexts) + max(tokens) + decode_steps + 8
    blocks = (max(batches) + 2) * (-(-max_ctx // block_size) + 1)
    sched = SchedulerConfig(max_num_seqs=max(batches) + 2, max_num_batched_tokens=max_ctx * 2)
    prof = StepProfile()
    seed = 0
    for c in contexts:
        eng = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, block_size=block_size), loaded=loaded)
        ctx = _tokens(seed := seed + 1, c, vocab)
        eng.generate([ctx], _ONE)                       # the context is now cached
        for t in tokens:
            eng.add_request(ctx + _tokens(seed := seed + 1, t, vocab), _ONE)
            t0 = time.perf_counter()
            eng.step()
            prof.prefill.append((t + c % block_size if c % block_size else t, c, time.perf_counter() - t0))
            while eng.has_work():
                eng.step()
        for b in batches:
            for i in range(b):
                eng.add_request(ctx + _tokens(seed := seed + 1, 1, vocab),
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
                eng.add_request(ctx + _tokens(seed := seed + 1, t, vocab), _ONE)
                t0 = time.perf_counter()
                eng.step()
                prof.mixed.append((b, c, t, time.perf_counter() - t0))
            for rid in eng.request_ids():
                eng.abort(rid)
        eng.close()
    return prof

"""Step time of one simulated worker: a roofline model or a fitted profile (pure).

A step is a list of ``(new_tokens, context)`` items: a decode is ``(1, ctx)``, a prefill
chunk ``(n, ctx)`` computes ``n`` tokens over ``ctx`` cached ones.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod

from warmpath.engine.step_model import StepModel
from warmpath.sim.hardware import HardwareProfile
from warmpath.sim.model_profile import ModelProfile


class StepTime(ABC):
    """Seconds one engine step takes (the only modelled part of a simulated worker)."""

    @abstractmethod
    def step_s(self, items: list[tuple[int, int]]) -> float:
        """Time of one step computing ``items``."""

    @abstractmethod
    def prefill_tok_s(self) -> float:
        """Rough prefill speed (tokens/s) a worker reports to the router."""


class Roofline(StepTime):
    """A step as its two kinds of kernels, each bound by compute or memory, over ``tp`` GPUs,
    plus the TP all-reduces and the overheads. GEMMs and attention run one after the other,
    so their times add; each is the larger of its FLOPs and its bytes:

    * linear layers: FLOPs per token and the LM head once per sequence
      (``ModelProfile.linear_flops``) at what GEMMs of the weights' precision reach
      (``gemm_flops``) vs the weights the step reads (a mixture of experts: only the experts
      routed to) at ``hbm · mbu``;
    * attention: FLOPs quadratic in the context at the BF16 peak times ``attn_mfu`` vs every
      item's KV read and the KV written, at ``hbm · mbu``.

    So a large decode batch pays both its GEMMs' compute and its KV reads, where one roofline
    over the whole step would hide one behind the other. All-reduce: 2 per layer, each moving
    ``2·(tp−1)/tp`` of the BF16 activations over NVLink at ``ar_eff`` of its bandwidth, plus
    ``ar_latency_s`` per call. Overheads: ``step_overhead_s`` per step and ``seq_overhead_s``
    per sequence in it. Mixed steps (decodes with a prefill chunk) are priced by the same form
    over all their items at once.
    """

    def __init__(self, model: ModelProfile, hw: HardwareProfile, tp: int = 1) -> None:
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        self.m, self.hw, self.tp = model, hw, tp

    def step_s(self, items: list[tuple[int, int]]) -> float:
        m, hw, tp = self.m, self.hw, self.tp
        tokens = sum(n for n, _ in items)
        if tokens == 0:
            return 0.0
        bw = hw.hbm_bytes_s * hw.mbu
        gemm = max(m.linear_flops(tokens, len(items)) / hw.gemm_flops(m.dtype_bytes), m.step_weight_bytes(tokens) / bw)
        attn = max(m.attention_flops(items) / (hw.flops * (hw.attn_mfu or hw.mfu)),
                   m.kv_bytes_per_token * sum(c + n for n, c in items) / bw)
        t = (gemm + attn) / tp
        if tp > 1:
            act = tokens * m.hidden * 2
            t += 2 * m.layers * (2 * (tp - 1) / tp * act / (hw.nvlink_bytes_s * hw.ar_eff) + hw.ar_latency_s)
        return t + hw.step_overhead_s + hw.seq_overhead_s * len(items)

    def prefill_tok_s(self) -> float:
        return 4096 / self.step_s([(4096, 0)])


class Fitted(StepTime):
    """Step times from a :class:`StepModel` fitted on the real engine (``warmpath calibrate``):
    decodes cost ``decode_s(batch, mean ctx)``, prefills ``prefill_s``; a step with both costs
    ``mixed_s`` — the mixed form fitted on timed and served mixed steps
    (``m0 + m1·t + m2·t·c_prefill + m3·b + m4·b·c_decode``), or decode + prefill − a0 for a
    calibration with too few of them (its ``mixed_form`` says which)."""

    def __init__(self, model: StepModel) -> None:
        self.model = model

    def step_s(self, items: list[tuple[int, int]]) -> float:
        return self.model.step_s(items)

    def prefill_tok_s(self) -> float:
        return 2048 / self.model.prefill_s(2048, 0)


class Jittered(StepTime):
    """Another step time times a seeded log-normal factor of mean 1 and coefficient of
    variation ``cv``: real steps of the same shape vary (measured 3–6% on this machine), and
    under load that decides which requests collide. Deterministic for ``seed``."""

    def __init__(self, inner: StepTime, cv: float, seed: int | str) -> None:
        if cv < 0:
            raise ValueError(f"cv must be >= 0, got {cv}")
        self.inner, self.cv = inner, cv
        self.sigma = math.sqrt(math.log1p(cv * cv))
        self.rng = random.Random(seed)

    def step_s(self, items: list[tuple[int, int]]) -> float:
        t = self.inner.step_s(items)
        if self.sigma == 0.0 or t == 0.0:
            return t
        return t * math.exp(self.rng.gauss(-self.sigma * self.sigma / 2, self.sigma))

    def prefill_tok_s(self) -> float:
        return self.inner.prefill_tok_s()

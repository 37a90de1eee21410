"""A fitted step-time model of one engine (from ``warmpath calibrate``; used by the router's
PPD table and by the simulator's executor).

NOTE: no torch (numpy only for the fit).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field

import numpy as np


def fit_linear(rows: list[tuple]) -> tuple[float, float, float]:
    """Least squares of ``s = k0 + k1·a + k2·a·c`` over rows ``(a, c, s)``."""
    if len(rows) < 3:
        raise ValueError(f"need at least 3 measurements to fit, got {len(rows)}")
    x = np.array([[1.0, a, a * c] for a, c, _ in rows])
    y = np.array([s for _, _, s in rows])
    return tuple(float(v) for v in np.linalg.lstsq(x, y, rcond=None)[0])


@dataclass(frozen=True)
class StepModel:
    """Step times in seconds: ``prefill = a0 + a1·t + a2·t·c`` for ``t`` new tokens over ``c``
    tokens of context; ``decode = d0 + d1·b + d2·b·c`` for ``b`` sequences at context ``c``;
    a decode step that also runs an append-prefill costs decode + prefill − a0.
    ``decode_scale[b - 1]``: a measured correction of the decode line at batch ``b`` (small
    batches are not linear on a CPU's matmul kernels); batches beyond it are not corrected."""

    prefill_coef: tuple[float, float, float]
    decode_coef: tuple[float, float, float]
    decode_scale: tuple[float, ...] = ()

    def prefill_s(self, tokens: int, context: int) -> float:
        a0, a1, a2 = self.prefill_coef
        return max(0.0, a0 + a1 * tokens + a2 * tokens * context)

    def decode_s(self, batch: int, context: int) -> float:
        d0, d1, d2 = self.decode_coef
        k = self.decode_scale[batch - 1] if 0 < batch <= len(self.decode_scale) else 1.0
        return max(0.0, k * (d0 + d1 * batch + d2 * batch * context))

    def mixed_s(self, batch: int, context: int, tokens: int) -> float:
        return self.decode_s(batch, context) + max(0.0, self.prefill_s(tokens, context) - self.prefill_coef[0])

    def step_s(self, items: list[tuple[int, int]]) -> float:
        """One step of ``(new_tokens, context)`` items: decodes (``new_tokens == 1``) cost
        ``decode_s(batch, mean context)``; prefill tokens add ``prefill_s`` of their sum at
        their token-weighted context, less its fixed part when they share the step with decodes."""
        dec = [c for n, c in items if n == 1]
        pre = [(n, c) for n, c in items if n > 1]
        t = self.decode_s(len(dec), sum(dec) // len(dec)) if dec else 0.0
        if pre:
            n = sum(x for x, _ in pre)
            p = self.prefill_s(n, sum(c * x for x, c in pre) // n)
            t += p - self.prefill_coef[0] if dec else p
        return t

    def to_json(self) -> dict:
        return {"prefill_coef": list(self.prefill_coef), "decode_coef": list(self.decode_coef),
                "decode_scale": list(self.decode_scale)}

    @classmethod
    def from_json(cls, d: dict) -> "StepModel":
        return cls(tuple(d["prefill_coef"]), tuple(d["decode_coef"]), tuple(d.get("decode_scale", ())))


@dataclass
class StepProfile:
    """Timed steps to fit a :class:`StepModel` on (``warmpath calibrate``)."""

    prefill: list[tuple[int, int, float]] = field(default_factory=list)     # (tokens, context, s)
    decode: list[tuple[int, int, float]] = field(default_factory=list)      # (batch, context, s)
    mixed: list[tuple[int, int, int, float]] = field(default_factory=list)  # (batch, ctx, tokens, s)

    def fit(self, min_rows: int = 10) -> StepModel:
        """Least squares lines; then, batch size by batch size from 1 up while each has
        ``min_rows`` decode rows, the median of measured over fitted as ``decode_scale``."""
        line = StepModel(fit_linear(self.prefill), fit_linear(self.decode))
        scale = []
        for b in itertools.count(1):
            ratios = [s / line.decode_s(n, c) for n, c, s in self.decode if n == b and line.decode_s(n, c) > 0]
            if len(ratios) < min_rows:
                break
            scale.append(round(statistics.median(ratios), 4))
        return StepModel(line.prefill_coef, line.decode_coef, tuple(scale))

    def extend(self, other: "StepProfile") -> "StepProfile":
        """This profile's rows plus ``other``'s."""
        return StepProfile(self.prefill + other.prefill, self.decode + other.decode, self.mixed + other.mixed)

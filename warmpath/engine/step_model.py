"""A fitted step-time model of one engine (from ``warmpath calibrate``; used by the router's
PPD table and by the simulator's executor).

NOTE: no torch (numpy only for the fit).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    a decode step that also runs an append-prefill costs decode + prefill − a0."""

    prefill_coef: tuple[float, float, float]
    decode_coef: tuple[float, float, float]

    def prefill_s(self, tokens: int, context: int) -> float:
        a0, a1, a2 = self.prefill_coef
        return max(0.0, a0 + a1 * tokens + a2 * tokens * context)

    def decode_s(self, batch: int, context: int) -> float:
        d0, d1, d2 = self.decode_coef
        return max(0.0, d0 + d1 * batch + d2 * batch * context)

    def mixed_s(self, batch: int, context: int, tokens: int) -> float:
        return self.decode_s(batch, context) + max(0.0, self.prefill_s(tokens, context) - self.prefill_coef[0])

    def to_json(self) -> dict:
        return {"prefill_coef": list(self.prefill_coef), "decode_coef": list(self.decode_coef)}

    @classmethod
    def from_json(cls, d: dict) -> "StepModel":
        return cls(tuple(d["prefill_coef"]), tuple(d["decode_coef"]))

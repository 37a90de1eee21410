"""A fitted step-time model of one engine (from ``warmpath calibrate``; used by the router's
PPD table and by the simulator's executor).

NOTE: no torch (numpy only for the fit).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field

import numpy as np

MIXED_TERMS = ("1", "t", "t*c_prefill", "b", "b*c_decode")
MIXED_MIN_ROWS = 10   # fewer timed mixed steps than this: the mixed step stays decode + prefill - a0


def fit_linear(rows: list[tuple]) -> tuple[float, float, float]:
    """Least squares of ``s = k0 + k1·a + k2·a·c`` over rows ``(a, c, s)``, every ``k ≥ 0``
    (no step gets cheaper with more work: with the C decode kernel a sequence costs so little
    that noise made the unconstrained per-sequence term negative at batches 1 and 4)."""
    if len(rows) < 3:
        raise ValueError(f"need at least 3 measurements to fit, got {len(rows)}")
    x = np.array([[1.0, a, a * c] for a, c, _ in rows])
    y = np.array([s for _, _, s in rows])
    best, best_err = np.zeros(3), float(np.sum(y * y))
    for terms in itertools.product((True, False), repeat=3):   # 3 terms: every subset, exactly
        cols = np.array(terms)
        if not cols.any():
            continue
        k = np.zeros(3)
        k[cols] = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        err = float(np.sum((x @ k - y) ** 2))
        if (k >= 0).all() and err < best_err - 1e-18:
            best, best_err = k, err
    return tuple(float(v) for v in best)


def nnls(a: np.ndarray, y: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """Non-negative least squares (Lawson–Hanson active set): ``x ≥ 0`` minimising ``|a·x − y|``."""
    n = a.shape[1]
    x, active = np.zeros(n), np.zeros(n, dtype=bool)
    w = a.T @ (y - a @ x)
    for _ in range(3 * n + 3):
        if active.all() or w[~active].max() <= tol:
            break
        active[int(np.argmax(np.where(active, -np.inf, w)))] = True
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.lstsq(a[:, active], y, rcond=None)[0]
            if z[active].min() > 0:
                x = z
                break
            neg = active & (z <= 0)       # step back to the boundary, drop what reached it
            x = x + np.min(x[neg] / (x[neg] - z[neg])) * (z - x)
            active &= x > tol
            x[~active] = 0.0
        w = a.T @ (y - a @ x)
    return x


def mixed_row(row: tuple) -> tuple[int, int, int, int, float]:
    """A mixed-step row as ``(batch, decode context, tokens, prefill context, s)``; an old
    4-tuple ``(batch, context, tokens, s)`` had one context for both."""
    if len(row) == 4:
        b, c, t, s = row
        return b, c, t, c, s
    return tuple(row)


def fit_mixed(rows: list[tuple]) -> tuple[float, ...]:
    """``s = m0 + m1·t + m2·t·c_prefill + m3·b + m4·b·c_decode`` over mixed rows
    (:func:`mixed_row`), every coefficient ≥ 0 (more tokens, sequences or context never cost
    less), least squares of the *relative* error (each row weighted by 1/s: a 0.1 s step
    counts as much as a 2 s one)."""
    r = [mixed_row(x) for x in rows]
    if len(r) < len(MIXED_TERMS):
        raise ValueError(f"need at least {len(MIXED_TERMS)} mixed steps to fit, got {len(r)}")
    x = np.array([[1.0, t, t * cp, b, b * cd] for b, cd, t, cp, _ in r])
    y = np.array([s for *_, s in r])
    w = 1.0 / np.maximum(y, 1e-9)
    return tuple(float(v) for v in nnls(x * w[:, None], y * w))


@dataclass(frozen=True)
class StepModel:
    """Step times in seconds: ``prefill = a0 + a1·t + a2·t·c`` for ``t`` new tokens over ``c``
    tokens of context; ``decode = d0 + d1·b + d2·b·c`` for ``b`` sequences at context ``c``.
    A decode step that also runs a prefill chunk (PPD's append-prefill, a handoff's tail):
    ``mixed = m0 + m1·t + m2·t·c_prefill + m3·b + m4·b·c_decode`` when ``mixed_coef`` was
    fitted on ``mixed_rows`` timed mixed steps (:func:`fit_mixed`), else decode + prefill − a0
    (the assumed form, kept for calibrations with too few mixed steps).
    ``decode_scale[b - 1]``: a measured correction of the decode line at batch ``b`` (small
    batches are not linear on a CPU's matmul kernels); batches beyond it are not corrected.
    ``decode_factor``: the decodes' cost as served over the calibrated one (every batch, and the
    decode terms of a mixed step), measured on a served run the isolated steps do not match
    (pinned workers: ``benchmarks/policies/ranking_sim.py``); 1: as calibrated."""

    prefill_coef: tuple[float, float, float]
    decode_coef: tuple[float, float, float]
    decode_scale: tuple[float, ...] = ()
    mixed_coef: tuple[float, ...] = ()
    mixed_rows: int = 0
    decode_factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.decode_factor > 0:
            raise ValueError(f"decode_factor must be > 0, got {self.decode_factor}")

    def prefill_s(self, tokens: int, context: int) -> float:
        a0, a1, a2 = self.prefill_coef
        return max(0.0, a0 + a1 * tokens + a2 * tokens * context)

    def decode_s(self, batch: int, context: int) -> float:
        d0, d1, d2 = self.decode_coef
        k = self.decode_scale[batch - 1] if 0 < batch <= len(self.decode_scale) else 1.0
        return max(0.0, self.decode_factor * k * (d0 + d1 * batch + d2 * batch * context))

    def mixed_s(self, batch: int, context: int, tokens: int, prefill_context: int | None = None) -> float:
        """``batch`` decodes at mean ``context`` plus ``tokens`` prefill tokens over
        ``prefill_context`` (default ``context``) in one step."""
        pc = context if prefill_context is None else prefill_context
        if self.mixed_coef:
            m0, m1, m2, m3, m4 = self.mixed_coef
            decodes = self.decode_factor * (m3 * batch + m4 * batch * context)
            return max(0.0, m0 + m1 * tokens + m2 * tokens * pc + decodes)
        return self.decode_s(batch, context) + max(0.0, self.prefill_s(tokens, pc) - self.prefill_coef[0])

    @property
    def mixed_form(self) -> str:
        """Which mixed-step form this model uses, in words (written to the calibration)."""
        if self.mixed_coef:
            return f"fitted: m0 + m1*t + m2*t*c_prefill + m3*b + m4*b*c_decode on {self.mixed_rows} mixed steps"
        return (f"assumed: decode + prefill - a0 (fewer than {MIXED_MIN_ROWS} mixed steps: "
                f"{self.mixed_rows})")

    def step_s(self, items: list[tuple[int, int]]) -> float:
        """One step of ``(new_tokens, context)`` items: decodes (``new_tokens == 1``) cost
        ``decode_s(batch, mean context)``, prefill chunks ``prefill_s`` of their summed tokens
        at their token-weighted context; both in one step cost ``mixed_s``."""
        dec = [c for n, c in items if n == 1]
        pre = [(n, c) for n, c in items if n > 1]
        n = sum(x for x, _ in pre)
        pc = sum(c * x for x, c in pre) // n if pre else 0
        if not dec:
            return self.prefill_s(n, pc) if pre else 0.0
        dc = sum(dec) // len(dec)
        return self.mixed_s(len(dec), dc, n, pc) if pre else self.decode_s(len(dec), dc)

    def to_json(self) -> dict:
        return {"prefill_coef": list(self.prefill_coef), "decode_coef": list(self.decode_coef),
                "decode_scale": list(self.decode_scale), "mixed_coef": list(self.mixed_coef) or None,
                "mixed_terms": list(MIXED_TERMS), "mixed_rows": self.mixed_rows, "mixed_form": self.mixed_form,
                "decode_factor": self.decode_factor}

    @classmethod
    def from_json(cls, d: dict) -> "StepModel":
        """A model from :meth:`to_json`; calibrations older than the mixed fit load with the
        assumed mixed form."""
        return cls(tuple(d["prefill_coef"]), tuple(d["decode_coef"]), tuple(d.get("decode_scale", ())),
                   tuple(d.get("mixed_coef") or ()), int(d.get("mixed_rows", 0)),
                   float(d.get("decode_factor", 1.0)))


@dataclass
class StepProfile:
    """Timed steps to fit a :class:`StepModel` on (``warmpath calibrate``)."""

    prefill: list[tuple[int, int, float]] = field(default_factory=list)     # (tokens, context, s)
    decode: list[tuple[int, int, float]] = field(default_factory=list)      # (batch, context, s)
    mixed: list[tuple] = field(default_factory=list)   # (batch, decode ctx, tokens, prefill ctx, s)

    def fit(self, min_rows: int = 10, min_mixed: int = MIXED_MIN_ROWS) -> StepModel:
        """Least squares lines; then, batch size by batch size from 1 up while each has
        ``min_rows`` decode rows, the median of measured over fitted as ``decode_scale``; the
        mixed form (:func:`fit_mixed`) when there are ``min_mixed`` mixed rows."""
        line = StepModel(fit_linear(self.prefill), fit_linear(self.decode))
        scale = []
        for b in itertools.count(1):
            ratios = [s / line.decode_s(n, c) for n, c, s in self.decode if n == b and line.decode_s(n, c) > 0]
            if len(ratios) < min_rows:
                break
            scale.append(round(statistics.median(ratios), 4))
        mixed = fit_mixed(self.mixed) if len(self.mixed) >= max(min_mixed, len(MIXED_TERMS)) else ()
        return StepModel(line.prefill_coef, line.decode_coef, tuple(scale), mixed, len(self.mixed))

    def extend(self, other: "StepProfile") -> "StepProfile":
        """This profile's rows plus ``other``'s."""
        return StepProfile(self.prefill + other.prefill, self.decode + other.decode, self.mixed + other.mixed)

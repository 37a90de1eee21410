"""Sample statistics shared by the router and the benchmark (no torch, no imports from warmpath)."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(xs: Iterable[float], q: float) -> float | None:
    """Linear-interpolated ``q``-th percentile, ``q`` in 0..100 (numpy's default); ``None`` for no data."""
    s = sorted(xs)
    if not s:
        return None
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)

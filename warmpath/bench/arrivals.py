"""Arrival processes: Poisson, gamma (bursty), ramp-then-steady; all seeded (no torch)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ArrivalConfig:
    """``rate`` requests/s; ``burstiness`` is the gamma shape (1 = Poisson, < 1 burstier);
    ``ramp_s`` seconds of linear ramp from 0 to ``rate`` before ``duration_s`` at ``rate``."""

    rate: float
    duration_s: float
    burstiness: float = 1.0
    ramp_s: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if self.duration_s <= 0:
            raise ValueError(f"duration must be > 0, got {self.duration_s}")
        if self.burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.ramp_s < 0:
            raise ValueError(f"ramp must be >= 0, got {self.ramp_s}")


def arrival_times(cfg: ArrivalConfig) -> list[float]:
    """Arrival times in ``[0, ramp_s + duration_s)``.

    Gaps are gamma(shape=b, scale=1/(rate·b)) — mean 1/rate, CV 1/sqrt(b) — in *operational
    time*; during the ramp the instantaneous rate grows linearly, which is applied by
    time-warping (t_op = rate·t²/(2·ramp) while ramping).
    """
    rng = random.Random(cfg.seed)
    total = cfg.ramp_s + cfg.duration_s
    out, op = [], 0.0
    # operational time (in units of "expected arrivals") at the end of the ramp
    ramp_ops = cfg.rate * cfg.ramp_s / 2
    while True:
        op += rng.gammavariate(cfg.burstiness, 1.0 / cfg.burstiness)
        if op < ramp_ops:
            t = (2 * op * cfg.ramp_s / cfg.rate) ** 0.5
        else:
            t = cfg.ramp_s + (op - ramp_ops) / cfg.rate
        if t >= total:
            return out
        out.append(t)


def session_seed(seed: int, rate: float) -> int:
    """The seed of the sessions of one open-loop rate point: new prompts at every rate (a
    server that ran the previous point still holds its KV), the same in ``warmpath bench``
    and ``warmpath bench --sim`` / ``warmpath sim`` (the arrivals keep ``seed``)."""
    return seed + int(round(rate * 1000, 6))   # 0.57 * 1000 is 569.99...: rounded first

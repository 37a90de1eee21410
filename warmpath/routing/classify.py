"""The one definition of a cold request (pure; policies, router metrics and simulator share it).

A request is *cold* when too little of it is cached where it could be computed: its reuse
(the most prompt tokens any candidate worker would not have to compute, by the TTFT
estimate's own load-vs-recompute rule) is below ``cold_threshold`` of the prompt, or below
``min_cached_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.routing.estimate import estimate
from warmpath.routing.views import RequestView, Snapshot, WorkerView


@dataclass(frozen=True)
class ColdRule:
    """Cold below ``cold_threshold`` reuse or ``min_cached_tokens`` cached tokens."""

    cold_threshold: float = 0.5
    min_cached_tokens: int = 256

    def __post_init__(self) -> None:
        if not 0 <= self.cold_threshold <= 1:
            raise ValueError(f"cold_threshold must be in [0, 1], got {self.cold_threshold}")
        if self.min_cached_tokens < 0:
            raise ValueError(f"min_cached_tokens must be >= 0, got {self.min_cached_tokens}")

    def is_cold(self, cached_tokens: int, num_tokens: int) -> bool:
        return cached_tokens / max(1, num_tokens) < self.cold_threshold or cached_tokens < self.min_cached_tokens

    def label(self, cached_tokens: int, num_tokens: int) -> str:
        """``"cold"`` or ``"warm"``."""
        return "cold" if self.is_cold(cached_tokens, num_tokens) else "warm"


def reuse(req: RequestView, snap: Snapshot, workers: list[WorkerView] | None = None,
          estimates: list | None = None) -> int:
    """The most prompt tokens any of ``workers`` (default: every worker the snapshot has
    prefix hits for) would get from its caches; ``estimates``: their ``estimate(w, req,
    snap)`` when the caller has them already (a policy scoring the same workers)."""
    if estimates is None:
        pool = workers if workers is not None else [w for w in snap.workers if w.worker_id in snap.hits]
        estimates = [estimate(w, req, snap) for w in pool]
    return max((e.cached_tokens for e in estimates), default=0)

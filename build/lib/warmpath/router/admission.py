"""Admission control: bounded requests in flight, bounded per-tier wait queues (pure)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AdmissionConfig:
    """``max_in_flight`` running at once; beyond it, up to ``queue_limits[tier]`` wait;
    beyond that the request is rejected (HTTP 429, ``retry_after_s``)."""

    max_in_flight: int = 24
    queue_limits: dict = field(default_factory=lambda: {"cold": 32, "warm": 64})
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.max_in_flight <= 0:
            raise ValueError(f"max_in_flight must be > 0, got {self.max_in_flight}")
        if any(v < 0 for v in self.queue_limits.values()):
            raise ValueError("queue limits must be >= 0")


@dataclass
class Admission:
    """FIFO per tier; warm waiters are released before cold ones so a cold flood cannot
    starve warm traffic. Call :meth:`offer`, then :meth:`release` when a request ends."""

    cfg: AdmissionConfig = field(default_factory=AdmissionConfig)
    in_flight: int = 0
    queues: dict[str, deque] = field(default_factory=dict)
    rejected: int = 0

    def offer(self, key: object, tier: str) -> str:
        """``"run"``, ``"queued"`` or ``"rejected"``."""
        if self.in_flight < self.cfg.max_in_flight and not self.waiting():
            self.in_flight += 1
            return "run"
        q = self.queues.setdefault(tier, deque())
        if len(q) >= self.cfg.queue_limits.get(tier, 0):
            self.rejected += 1
            return "rejected"
        q.append(key)
        return "queued"

    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def cancel(self, key: object) -> bool:
        """Remove a waiter that gave up (e.g. its client disconnected)."""
        for q in self.queues.values():
            if key in q:
                q.remove(key)
                return True
        return False

    def release(self) -> object | None:
        """A running request ended; returns the waiter that may start now, if any."""
        self.in_flight -= 1
        for tier in ("warm", "cold", *sorted(set(self.queues) - {"warm", "cold"})):
            q = self.queues.get(tier)
            if q:
                self.in_flight += 1
                return q.popleft()
        return None

"""Processes sharing a few CPU cores: processor sharing of the simulated workers' steps
and KV transfers (pure).

On the CPU profile every worker, and the store's process serving its transfers, run on the
same ``cores``. A job is a list of phases ``(seconds alone, cores demanded)``: a step is its
KV loads (the worker plus ``transfer_cpu`` of the store's process) then its compute (one
core); a write-through put is one transfer phase. While the running phases demand ``D``
cores in all, every job advances at ``min(1, cores / D)`` of its own speed, divided by
``1 + contention·(min(D, cores) − 1)`` (cores running at once slow each other down through
the caches and memory they share). Whenever a job starts or changes phase, every running
job's end is recomputed: a step that started alone slows down when others start later,
as it does under the operating system's scheduler.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

Schedule = Callable[..., None]   # (time, fn, *args): the simulation's event queue


@dataclass
class _Job:
    phases: list[list[float]]        # [seconds left at full speed, cores demanded]
    done: Callable[[], None]
    version: int = -1


@dataclass
class SharedCores:
    """Jobs on ``cores`` shared cores; ends are delivered through ``at`` (the event queue)."""

    cores: float
    at: Schedule
    contention: float = 0.0
    jobs: dict[str, _Job] = field(default_factory=dict)
    t: float = 0.0
    speed: float = 1.0
    busy_core_s: float = 0.0         # core-seconds served (the summary's cpu_cores_busy)
    _versions: itertools.count = field(default_factory=itertools.count)   # unique across jobs

    def __post_init__(self) -> None:
        if self.cores <= 0:
            raise ValueError(f"cores must be > 0, got {self.cores}")
        if self.contention < 0:
            raise ValueError(f"contention must be >= 0, got {self.contention}")

    def run(self, now: float, key: str, phases: list[tuple[float, float]], done: Callable[[], None]) -> None:
        """Start job ``key`` (one per key at a time) at ``now``; ``done()`` is called when its
        last phase ends."""
        if key in self.jobs:
            raise RuntimeError(f"job {key} is already running")
        self._advance(now)
        left = [[s, d] for s, d in phases if s > 0]
        if not left:
            self.at(now, done)
            return
        self.jobs[key] = _Job(left, done)
        self._reschedule(now)

    def demand(self) -> float:
        """Cores the running phases ask for."""
        return sum(j.phases[0][1] for j in self.jobs.values())

    def _advance(self, now: float) -> None:
        dt = now - self.t
        if dt > 0:
            for j in self.jobs.values():
                j.phases[0][0] = max(0.0, j.phases[0][0] - dt * self.speed)
            self.busy_core_s += dt * min(self.cores, self.demand())
        self.t = max(self.t, now)

    def _reschedule(self, now: float) -> None:
        d = self.demand()
        self.speed = min(1.0, self.cores / d) / (1.0 + self.contention * max(0.0, min(d, self.cores) - 1.0)) \
            if d > 0 else 1.0
        for key, j in self.jobs.items():
            j.version = next(self._versions)
            self.at(now + j.phases[0][0] / self.speed, self._phase_end, key, j.version)

    def _phase_end(self, key: str, version: int) -> None:
        j = self.jobs.get(key)
        if j is None or j.version != version:
            return   # superseded by a later reschedule
        now = self.t + j.phases[0][0] / self.speed
        self._advance(now)
        j.phases.pop(0)
        if not j.phases:
            del self.jobs[key]
        self._reschedule(now)
        if not j.phases:
            j.done()

"""Worker discovery: registration, heartbeats, and dropping silent workers (pure).

Workers register with their role and endpoints, then heartbeat every ``heartbeat_s`` with
their load and measured speeds; a worker silent for ``drop_after_s`` is dropped, and the
caller removes its index entries, sessions and not-yet-started requests.

NOTE: no torch, no I/O; ``now`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from warmpath.routing.views import ROLES, WorkerView


@dataclass(frozen=True)
class DiscoveryConfig:
    heartbeat_s: float = 10.0
    drop_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.heartbeat_s <= 0 or self.drop_after_s <= self.heartbeat_s:
            raise ValueError("need 0 < heartbeat_s < drop_after_s, got "
                             f"{self.heartbeat_s} / {self.drop_after_s}")

    @property
    def check_every_s(self) -> float:
        """How often the router looks for silent workers: every quarter heartbeat, at most
        once a second, so a silent worker is dropped by ``drop_after_s + check_every_s``."""
        return min(1.0, self.heartbeat_s / 4)


@dataclass
class WorkerRecord:
    view: WorkerView
    url: str
    events_endpoint: str | None
    replay_endpoint: str | None
    last_seen: float


@dataclass
class Registry:
    cfg: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    workers: dict[str, WorkerRecord] = field(default_factory=dict)

    def register(self, worker_id: str, role: str, url: str, now: float,
                 events_endpoint: str | None = None, replay_endpoint: str | None = None,
                 max_seqs: int | None = None, kv_tokens: int | None = None,
                 overlaps_loads: bool = False, chunk_tokens: int | None = None,
                 default_max_tokens: int | None = None) -> None:
        """Add (or re-add after a restart) a worker with what it can hold (``max_seqs``,
        ``kv_tokens``: ``None`` when it did not say), whether its L3 loads run beside its
        steps, its prefill chunk (``chunk_tokens``) and the answer budget a request without
        ``max_tokens`` gets there (``default_max_tokens``). Raises ``ValueError`` on a bad role or
        an id already used by a live worker at another URL."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        old = self.workers.get(worker_id)
        if old is not None and old.url != url and now - old.last_seen <= self.cfg.drop_after_s:
            raise ValueError(f"worker id {worker_id!r} is already registered at {old.url}")
        self.workers[worker_id] = WorkerRecord(WorkerView(
            worker_id, role, max_seqs=max_seqs, kv_tokens=kv_tokens, overlaps_loads=overlaps_loads,
            chunk_tokens=chunk_tokens, default_max_tokens=default_max_tokens), url, events_endpoint,
                                               replay_endpoint, now)

    def heartbeat(self, worker_id: str, now: float, **load) -> bool:
        """Record a heartbeat with load fields of :class:`WorkerView`; ``False`` if unknown
        (the worker should register again)."""
        rec = self.workers.get(worker_id)
        if rec is None:
            return False
        unknown = set(load) - set(WorkerView.__dataclass_fields__) - {"worker_id", "role"}
        if unknown:
            raise ValueError(f"unknown heartbeat fields: {sorted(unknown)}")
        rec.view = replace(rec.view, **load)
        rec.last_seen = now
        return True

    def set_role(self, worker_id: str, role: str) -> bool:
        """Change a registered worker's role (elastic tiers); ``False`` if unknown."""
        rec = self.workers.get(worker_id)
        if rec is None or role not in ROLES:
            return False
        rec.view = replace(rec.view, role=role)
        return True

    def expire(self, now: float) -> list[str]:
        """Drop workers silent for longer than ``drop_after_s``; returns their ids."""
        gone = [w for w, r in self.workers.items() if now - r.last_seen > self.cfg.drop_after_s]
        for w in gone:
            del self.workers[w]
        return gone

    def views(self) -> list[WorkerView]:
        return [r.view for r in self.workers.values()]

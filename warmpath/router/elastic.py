"""Elastic tiers: a prefill-type worker changes role between pre-prefill (cold tier) and
prefill (warm tier) when the mix of traffic drifts (pure; the caller passes the time).

The signal is each tier's predicted queue (seconds of queued prompt work, mean per
worker, from the router's learnt model). A tier is *pressed* when its queue exceeds both
``min_queue_s`` and ``ratio`` × the other tier's. Hysteresis: the pressure must hold for
``hold_s`` without a break, at most one change per ``cooldown_s``, and each tier keeps at
least one worker — so a burst does not flip roles and roles do not flap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.router.views import WorkerView

TIERS = {"cold": "pre-prefill", "warm": "prefill"}


@dataclass(frozen=True)
class ElasticConfig:
    enabled: bool = True
    ratio: float = 2.0
    min_queue_s: float = 1.0
    hold_s: float = 5.0
    cooldown_s: float = 20.0

    def __post_init__(self) -> None:
        if self.ratio < 1 or self.min_queue_s < 0 or self.hold_s < 0 or self.cooldown_s < 0:
            raise ValueError("elastic tiers: need ratio >= 1 and non-negative times")


@dataclass(frozen=True)
class RoleChange:
    at: float
    worker: str
    old: str
    new: str
    reason: str


@dataclass
class Elastic:
    """Decides role changes; :meth:`step` once a second or so."""

    cfg: ElasticConfig = ElasticConfig()
    pressed_since: dict[str, float | None] = field(default_factory=lambda: {"cold": None, "warm": None})
    last_change: float = float("-inf")
    changes: list[RoleChange] = field(default_factory=list)

    def step(self, views: list[WorkerView], queue_s, now: float) -> RoleChange | None:
        """``queue_s(view)``: predicted seconds of queued prompt work on a worker. Returns
        the change to apply now, if any (also kept in :attr:`changes`)."""
        if not self.cfg.enabled:
            return None
        tiers = {c: [w for w in views if w.role == r] for c, r in TIERS.items()}
        q = {c: sum(map(queue_s, ws)) / len(ws) if ws else 0.0 for c, ws in tiers.items()}
        for busy, idle in (("cold", "warm"), ("warm", "cold")):
            pressed = bool(tiers[busy]) and q[busy] > max(self.cfg.min_queue_s, self.cfg.ratio * q[idle])
            if not pressed:
                self.pressed_since[busy] = None
                continue
            since = self.pressed_since[busy]
            if since is None:
                self.pressed_since[busy] = since = now
            if (now - since >= self.cfg.hold_s and now - self.last_change >= self.cfg.cooldown_s
                    and len(tiers[idle]) >= 2):
                w = min(tiers[idle], key=lambda x: (queue_s(x), x.worker_id))
                ch = RoleChange(now, w.worker_id, w.role, TIERS[busy],
                                f"{busy} tier queue {q[busy]:.2f}s vs {q[idle]:.2f}s for {now - since:.0f}s")
                self.changes.append(ch)
                del self.changes[:-100]
                self.last_change = now
                self.pressed_since = {"cold": None, "warm": None}
                return ch
        return None

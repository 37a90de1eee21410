"""The other routers of an active-active fleet, as this one knows them (pure).

Several routers front one fleet (``warmpath serve --routers N``). Each follows every
worker's registration, heartbeats and KV events on its own, so each index converges from
the events alone; what the events do not carry, the routers tell each other every
``every_s`` (``router/peers.py``, a :class:`~warmpath.protocol.internal.PeerState`):

* **load** — the requests each has sent each worker and not seen finish, so two routers do
  not both pile onto the worker each believes idle (:meth:`PeerBook.load_of`);
* **admission** — the fleet's in-flight limit is shared: each router admits
  ``ceil(limit / routers alive)`` (``routing/admission.py``), rebalanced as routers come and go;
* **agreement** — index sizes and how far each has read each worker's events (``/v1/cluster``).

A router is alive while its reports keep coming (one within ``alive_s``).

NOTE: no torch, no I/O; ``now`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.routing.load import WorkerLoad


@dataclass(frozen=True)
class PeerConfig:
    """``peers``: the other routers' URLs (``--peer``); reports every ``every_s``; a router
    silent for ``alive_s`` no longer counts (its load, its share of the limit)."""

    peers: tuple[str, ...] = ()
    every_s: float = 0.25
    alive_s: float = 1.0

    def __post_init__(self) -> None:
        bad = [u for u in self.peers if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"--peer must be an http URL, got {bad[0]!r}")
        if not 0 < self.every_s < self.alive_s:
            raise ValueError(f"need 0 < every_s < alive_s, got {self.every_s} / {self.alive_s}")


@dataclass(frozen=True)
class PeerReport:
    """One router's last report (``PeerState``), stamped with when it arrived here."""

    at: float
    loads: dict[str, WorkerLoad]
    in_flight: int = 0
    waiting: int = 0
    index_blocks: dict[str, int] = field(default_factory=dict)
    event_seqs: dict[str, int] = field(default_factory=dict)


@dataclass
class PeerBook:
    """The latest report of every other router."""

    cfg: PeerConfig = field(default_factory=PeerConfig)
    reports: dict[str, PeerReport] = field(default_factory=dict)

    def note(self, router: str, report: PeerReport) -> None:
        self.reports[router] = report

    def alive(self, now: float) -> list[str]:
        """The routers heard from within ``alive_s``, sorted."""
        return sorted(r for r, p in self.reports.items() if now - p.at <= self.cfg.alive_s)

    def routers(self, now: float) -> int:
        """Routers sharing the fleet now: this one and those alive."""
        return 1 + len(self.alive(now))

    def load_of(self, worker: str, now: float) -> WorkerLoad:
        """What the routers alive have on ``worker`` together."""
        out = WorkerLoad()
        for r in self.alive(now):
            x = self.reports[r].loads.get(worker)
            if x is not None:
                out = out.plus(x)
        return out

    def to_json(self, now: float) -> list[dict]:
        """Every router heard from: alive or not, its in-flight, index sizes, event positions."""
        return [{"url": r, "alive": now - p.at <= self.cfg.alive_s, "last_report_s": round(now - p.at, 3),
                 "in_flight": p.in_flight, "waiting": p.waiting, "index_blocks": dict(p.index_blocks),
                 "event_seqs": dict(p.event_seqs)} for r, p in sorted(self.reports.items())]

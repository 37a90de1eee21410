"""The live dashboard's memory (pure, bounded; no torch, no I/O).

:class:`Dashboard` keeps what ``GET /v1/dashboard/state`` serves to ``/dashboard``:

* one sample a second (the last ``history_s``): TTFT p50/p90 and TPOT per class (cold,
  warm, turn 2+) over the requests that ended in the last ``window_s``, the admission queue
  (in flight, waiting) and 429s, prompt tokens by where their KV came from (L1/L2/L3 or
  computed, from each response's ``usage["warmpath"]``) and KV bytes handed off;
* the last ``decisions_kept`` routing decisions with their reason, predicted vs actual TTFT;
* every worker's role as last sampled, and a short log of role changes.

The router calls :meth:`Dashboard.trip_ended` when a request ends (``flow.py``) and
:meth:`Dashboard.sample` once a second (``app.py``'s housekeeping loop).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Protocol

from warmpath.stats import percentile

if TYPE_CHECKING:
    from warmpath.routing.admission import Admission
    from warmpath.router.metrics import RouterMetrics
    from warmpath.routing.registry import Registry
    from warmpath.router.trip import Trip


class Sampled(Protocol):
    """What the dashboard reads of the router (``RouterState`` is one): the registry, the
    admission queue, the metrics and the discovery settings (``cfg.discovery.heartbeat_s``)."""

    registry: Registry
    admission: Admission
    metrics: RouterMetrics
    cfg: object

CLASSES = ("cold", "warm", "turn2+")
SOURCES = ("L1", "L2", "L3", "computed")


def prompt_sources(usage: dict | None) -> dict[str, int] | None:
    """Prompt tokens by source, as measured by the stage that computed the prompt (the
    prefill worker's relayed report, else the serving worker's own); ``None`` when the
    response carried no ``usage["warmpath"]``."""
    if not usage:
        return None
    ext, n = usage.get("warmpath") or {}, int(usage.get("prompt_tokens", 0))
    if "prefill" in ext:
        p = ext["prefill"]
        tiers, computed = p.get("cached_by_tier") or {}, n - int(p.get("cached_tokens", 0))
    elif "worker" in ext:
        tiers, computed = ext["worker"].get("loaded_tokens") or {}, int(ext["worker"].get("recomputed_tokens", 0))
    else:
        return None
    return {**{k: int(tiers.get(k, 0)) for k in SOURCES[:3]}, "computed": max(0, computed)}


class Dashboard:
    """Bounded rings of 1-second samples, recent trips, decisions and role changes."""

    def __init__(self, history_s: int = 600, window_s: float = 60.0, decisions_kept: int = 50,
                 role_changes_kept: int = 50, trips_kept: int = 4096) -> None:
        self.window_s = window_s
        self.samples: deque[dict] = deque(maxlen=history_s)
        self.decisions: deque[dict] = deque(maxlen=decisions_kept)
        self.role_changes: deque[dict] = deque(maxlen=role_changes_kept)
        self.roles: dict[str, str] = {}
        self.recent: deque[tuple[float, tuple[str, ...], float | None, float | None]] = deque(maxlen=trips_kept)
        self.sources: Counter = Counter()           # since the start: tokens by source
        self._last = {"rejected": 0, "kv_bytes": 0.0, **{s: 0 for s in SOURCES}}

    def trip_ended(self, t: Trip, now: float | None = None) -> None:
        """Record a finished request: its TTFT / TPOT for the charts and its decision row."""
        now = time.monotonic() if now is None else now
        classes = (t.cls,) + (("turn2+",) if t.rv.turn >= 2 else ())
        n = t.completion_tokens
        tpot = (now - t.first_token_at) / (n - 1) if n > 1 and t.first_token_at is not None else None
        self.recent.append((now, classes, t.ttft_s, tpot))
        src = prompt_sources(t.usage)
        if src is not None:
            self.sources.update(src)
        d = t.decision
        self.decisions.append({
            "t": time.time(), "cls": t.cls, "turn": t.rv.turn, "path": d.path, "prefill": d.prefill,
            "decode": d.decode, "ppd": d.ppd, "reason": d.reason, "est_ttft_s": d.est_ttft_s,
            "est_tpot_s": d.est_tpot_s, "est_running_tpot_s": d.est_running_tpot_s,
            "ttft_s": t.ttft_s, "tpot_s": tpot, "prompt_tokens": t.rv.num_tokens,
            "cached_tokens": d.cached_tokens, "completion_tokens": n, "sources": src})

    def _latency(self, now: float) -> dict:
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()
        out = {}
        for c in CLASSES:
            ttft = [x for _, cs, x, _ in self.recent if c in cs and x is not None]
            tpot = [x for _, cs, _, x in self.recent if c in cs and x is not None]
            out[c] = {"ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
                      "tpot_p50": percentile(tpot, 50), "n": len(ttft)}
        return out

    def _delta(self, key: str, total: float) -> float:
        d, self._last[key] = total - self._last[key], total
        return d

    def note_change(self, worker: str, old: str, new: str, reason: str, wall: float | None = None) -> None:
        """Log a role change the router made (elastic roles), with its reason."""
        self.role_changes.append({"t": time.time() if wall is None else wall, "worker": worker,
                                  "from": old, "to": new, "reason": reason})
        if worker in self.roles:
            self.roles[worker] = new   # the next sample sees no other change

    def note_roles(self, roles: dict[str, str], wall: float) -> None:
        """Log every worker whose role differs from the last sample's (a new worker is not
        a change; a worker that left is forgotten)."""
        for w, role in roles.items():
            old = self.roles.get(w)
            if old is not None and old != role:
                self.role_changes.append({"t": wall, "worker": w, "from": old, "to": role})
        self.roles = dict(roles)

    def sample(self, s: Sampled, now: float | None = None, wall: float | None = None) -> dict:
        """Take this second's sample of ``s`` (rates are per second since the last sample)."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        dt = max(1e-3, now - self.samples[-1]["mono"]) if self.samples else 1.0
        self.note_roles({w: r.view.role for w, r in s.registry.workers.items()}, wall)
        row = {"t": wall, "mono": now, "classes": self._latency(now),
               "in_flight": s.admission.in_flight, "waiting": s.admission.waiting(), "limit": s.admission.limit,
               "rejected_s": self._delta("rejected", s.admission.rejected) / dt,
               "kv_bytes_s": self._delta("kv_bytes", s.metrics.kv_bytes._value.get()) / dt,
               "sources_s": {k: self._delta(k, self.sources[k]) / dt for k in SOURCES}}
        self.samples.append(row)
        return row

    def state(self, s: Sampled, now: float | None = None) -> dict:
        """The JSON the page polls: history, decisions, role log, and each worker's role,
        health and seconds since its last heartbeat (no URLs, no PIDs: those are in
        ``/v1/cluster`` for trusted callers)."""
        now = time.monotonic() if now is None else now
        late = s.cfg.discovery.heartbeat_s * 2
        workers = {w: {"role": r.view.role, "last_seen_s": round(now - r.last_seen, 3),
                       "health": "ok" if now - r.last_seen <= late else "late"}
                   for w, r in s.registry.workers.items()}
        return {"now": time.time(), "window_s": self.window_s, "workers": workers,
                "samples": [{k: v for k, v in x.items() if k != "mono"} for x in self.samples],
                "decisions": list(reversed(self.decisions)), "role_changes": list(reversed(self.role_changes)),
                "sources_total": {k: self.sources[k] for k in SOURCES},
                "admission": s.admission.to_json()}   # the limit in force and why

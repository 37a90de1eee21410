"""Routing policies: ``cpd`` (cold/warm tiers), ``pd`` (one prefill pool), ``replica``.

Each is a pure function of a :class:`Snapshot`; the real router and the simulator run the
same objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from warmpath.router.estimate import best, estimate, least_loaded_decode
from warmpath.router.state import Decision, RequestView, Snapshot, WorkerView


class RoutingPolicy(ABC):
    """Picks the prefill and decode workers for one request."""

    name: str = ""

    @abstractmethod
    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        """Raise ``LookupError`` when no healthy worker can take the request."""

    def decode_for(self, snap: Snapshot) -> WorkerView:
        """The session's decode worker when alive, else the least loaded one."""
        live = {w.worker_id: w for w in snap.by_role("decode")}
        if snap.session_decode_worker in live:
            return live[snap.session_decode_worker]
        d = least_loaded_decode(list(live.values()))
        if d is None:
            raise LookupError("no healthy decode worker")
        return d


@dataclass(frozen=True)
class CPDConfig:
    """Cold when the reuse ratio is below ``cold_threshold`` or fewer than
    ``min_cached_tokens`` tokens are cached; ``spill_factor``: a cold request goes to an
    idle warm worker when the cold tier's estimate is that many times worse."""

    cold_threshold: float = 0.5
    min_cached_tokens: int = 256
    spill_factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.cold_threshold <= 1:
            raise ValueError(f"cold_threshold must be in [0, 1], got {self.cold_threshold}")
        if self.spill_factor < 1:
            raise ValueError(f"spill_factor must be >= 1, got {self.spill_factor}")


class CPDPolicy(RoutingPolicy):
    name = "cpd"

    def __init__(self, cfg: CPDConfig = CPDConfig()) -> None:
        self.cfg = cfg

    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        cold_tier, warm_tier = snap.by_role("pre-prefill"), snap.by_role("prefill")
        if not cold_tier and not warm_tier:
            raise LookupError("no healthy prefill worker")
        cached = max((estimate(w, req, snap).cached_tokens for w in cold_tier + warm_tier), default=0)
        ratio = cached / req.num_tokens
        cold = ratio < self.cfg.cold_threshold or cached < self.cfg.min_cached_tokens
        dec = self.decode_for(snap)
        if cold and cold_tier:
            w, e = best(cold_tier, req, snap)
            spill = best([x for x in warm_tier if x.queued_prefill_tokens == 0], req, snap)
            if spill and e.ttft_s > self.cfg.spill_factor * spill[1].ttft_s:
                return Decision(spill[0].worker_id, dec.worker_id, "cold", spill[1].ttft_s,
                                spill[1].cached_tokens, f"spill: reuse {ratio:.2f}, cold tier busy")
            return Decision(w.worker_id, dec.worker_id, "cold", e.ttft_s, e.cached_tokens,
                            f"cold: reuse {ratio:.2f}")
        w, e = best(warm_tier or cold_tier, req, snap)
        return Decision(w.worker_id, dec.worker_id, "warm", e.ttft_s, e.cached_tokens, f"warm: reuse {ratio:.2f}")


class PDPolicy(RoutingPolicy):
    """The CPD blog's baseline: one shared prefill pool, least queued work, cache-blind."""

    name = "pd"

    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        pool = snap.by_role("prefill", "pre-prefill")
        if not pool:
            raise LookupError("no healthy prefill worker")
        w = min(pool, key=lambda x: (x.queued_prefill_tokens, x.worker_id))
        e = estimate(w, req, snap)
        return Decision(w.worker_id, self.decode_for(snap).worker_id, "pd", e.ttft_s, e.cached_tokens,
                        "least queued prefill")


class ReplicaPolicy(RoutingPolicy):
    """Aggregated workers with prefix-aware load balancing (lowest estimated TTFT)."""

    name = "replica"

    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        got = best(snap.by_role("replica"), req, snap, handoff=False)
        if got is None:
            raise LookupError("no healthy replica worker")
        w, e = got
        return Decision(w.worker_id, w.worker_id, "replica", e.ttft_s, e.cached_tokens, "prefix-aware")


POLICIES = {"cpd": CPDPolicy, "pd": PDPolicy, "replica": ReplicaPolicy}

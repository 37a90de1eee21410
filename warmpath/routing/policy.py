"""Routing policies: ``cpd`` (cold/warm tiers), ``pd`` (one prefill pool), ``replica``,
``goodput`` (every path — local, warm, cold — by predicted TTFT and TPOT; ``goodput.py``).

Each is a pure function of a :class:`Snapshot`; the real router and the simulator run the
same objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from warmpath.routing.classify import ColdRule, reuse
from warmpath.routing.estimate import best, estimate, harm_s, least_loaded_decode, tier_class
from warmpath.routing.goodput import GoodputConfig, choose, hold_s, paths, score
from warmpath.routing.views import Decision, PrefixHit, RequestView, Snapshot, WorkerView


class NoPrefillWorker(LookupError):
    """No healthy worker of a prefill-type role: the router may still prefill on a decode
    worker (``RouteDecider``'s fallback) rather than refuse the request."""

    def __init__(self) -> None:
        super().__init__("no healthy prefill worker")


class RoutingPolicy(ABC):
    """Picks the prefill and decode workers for one request."""

    name: str = ""
    cold_rule: ColdRule = ColdRule()     # what "cold" means for this policy's metrics and admission
    decides_local = False                # True: route() takes allow_local and picks local paths itself (no PPD switch)
    roles: tuple[str, ...] = ("pre-prefill", "prefill", "decode")   # the roles it routes to (elastic roles move among them)
    computes_anywhere = False            # True: any prompt may be computed on a decode-type worker (elastic.spare_last)

    @abstractmethod
    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        """Raise ``LookupError`` when no healthy worker can take the request."""

    def decode_for(self, snap: Snapshot) -> WorkerView:
        """The session's decode worker (or replica) when alive, else the least loaded one."""
        live = {w.worker_id: w for w in snap.by_role("decode", "replica")}
        if snap.session_decode_worker in live:
            return live[snap.session_decode_worker]
        d = least_loaded_decode(list(live.values()))
        if d is None:
            raise LookupError("no healthy decode worker")
        return d


@dataclass(frozen=True)
class CPDConfig:
    """Cold when the reuse ratio is below ``cold_threshold`` or fewer than
    ``min_cached_tokens`` tokens are cached (the request's class). The worker is the one
    with the lowest predicted TTFT plus ``harm_weight`` × the delay the request adds to the
    requests expected to arrive at that worker's tier while it computes there, each class's
    delay counted relative to its TTFT target (``warm_slo_s``, ``cold_slo_s``): a second
    lost by a warm request weighs what ten lost by a new document do."""

    cold_threshold: float = 0.5
    min_cached_tokens: int = 256
    harm_weight: float = 1.0
    warm_slo_s: float = 2.0
    cold_slo_s: float = 20.0

    def __post_init__(self) -> None:
        ColdRule(self.cold_threshold, self.min_cached_tokens)   # validates both
        if self.harm_weight < 0:
            raise ValueError(f"harm_weight must be >= 0, got {self.harm_weight}")
        if self.warm_slo_s <= 0 or self.cold_slo_s <= 0:
            raise ValueError("warm_slo_s and cold_slo_s must be > 0")

    def slo(self, cls: str) -> float:
        return self.cold_slo_s if cls == "cold" else self.warm_slo_s


class CPDPolicy(RoutingPolicy):
    """Cold prompts to the pre-prefill tier, warm ones to the prefill tier — by cost: any
    prefill-type worker may take a request when its predicted TTFT plus the harm it does
    there is lowest (a spill, either way)."""

    name = "cpd"

    def __init__(self, cfg: CPDConfig = CPDConfig()) -> None:
        self.cfg = cfg
        self.cold_rule = ColdRule(cfg.cold_threshold, cfg.min_cached_tokens)

    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        cold_tier, warm_tier = snap.by_role("pre-prefill"), snap.by_role("prefill")
        pool = cold_tier + warm_tier
        if not pool:
            raise NoPrefillWorker()
        ests = [estimate(w, req, snap) for w in pool]        # once each, for reuse and the scores
        cached = reuse(req, snap, pool, ests)
        cls = self.cold_rule.label(cached, req.num_tokens)
        dec = self.decode_for(snap)
        scored = []
        for w, e in zip(pool, ests):
            # the delay to the tier's class, in units of this request's own target
            h = self.cfg.harm_weight * harm_s(w, e, snap) * self.cfg.slo(cls) / self.cfg.slo(tier_class(w))
            scored.append((e.ttft_s + h, w.worker_id, w, e, h))
        _, _, w, e, h = min(scored, key=lambda x: x[:2])
        spill = " (spill)" if tier_class(w) != cls and (cold_tier if cls == "cold" else warm_tier) else ""
        return Decision(w.worker_id, dec.worker_id, cls, e.ttft_s, e.cached_tokens,
                        f"{cls}: reuse {cached / req.num_tokens:.2f}; TTFT {e.ttft_s:.3f}s + harm {h:.3f}s{spill}")


class PDPolicy(RoutingPolicy):
    """The CPD blog's baseline: one shared prefill pool, least queued work, cache-blind."""

    name = "pd"

    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        pool = snap.by_role("prefill", "pre-prefill")
        if not pool:
            raise NoPrefillWorker()
        w = min(pool, key=lambda x: (x.queued_prefill_tokens, x.worker_id))
        e = estimate(w, req, snap)
        return Decision(w.worker_id, self.decode_for(snap).worker_id, "pd", e.ttft_s, e.cached_tokens,
                        "least queued prefill")


class ReplicaPolicy(RoutingPolicy):
    """Aggregated workers with prefix-aware load balancing (lowest estimated TTFT). Ties —
    estimates within ``near`` (default 10%) of the lowest: replicas holding nothing of the
    prompt whose learnt speeds differ by less than the lines' own error — go to the one with
    the fewest queued tokens, then the fewest running (the decodes a prefill would slow),
    then the least recently chosen: spread, not replica-0 for every cold prompt."""

    name = "replica"
    roles = ("replica",)

    def __init__(self, near: float = 0.1) -> None:
        if near < 0:
            raise ValueError(f"near must be >= 0, got {near}")
        self.near = near
        self.last_routed: dict[str, int] = {}
        self._n = 0

    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        got = best(snap.by_role("replica"), req, snap, handoff=False, last_routed=self.last_routed, near=self.near)
        if got is None:
            raise LookupError("no healthy replica worker")
        w, e = got
        self._n += 1
        self.last_routed[w.worker_id] = self._n
        return Decision(w.worker_id, w.worker_id, "replica", e.ttft_s, e.cached_tokens, "prefix-aware")


class PDKVPolicy(RoutingPolicy):
    """One prefill pool with a KV-aware cost, as Dynamo's and llm-d's routers do: queued
    prefill tokens plus the request's uncached tokens, with cached blocks credited by tier
    (L1/L2 fully, L3 by ``l3_credit``); decode by least load."""

    name = "pd-kv"

    def __init__(self, l3_credit: float = 0.5) -> None:
        if not 0 <= l3_credit <= 1:
            raise ValueError(f"l3_credit must be in [0, 1], got {l3_credit}")
        self.l3_credit = l3_credit

    def cost(self, w: WorkerView, req: RequestView, snap: Snapshot) -> float:
        hit = snap.hits.get(w.worker_id, PrefixHit())
        credit = (hit.local_blocks + self.l3_credit * hit.l3_blocks) * req.block_size
        return w.queued_prefill_tokens + max(0.0, req.num_tokens - credit)

    def route(self, req: RequestView, snap: Snapshot) -> Decision:
        pool = snap.by_role("prefill", "pre-prefill")
        if not pool:
            raise NoPrefillWorker()
        c, _, w = min((self.cost(w, req, snap), w.worker_id, w) for w in pool)
        e = estimate(w, req, snap)
        return Decision(w.worker_id, self.decode_for(snap).worker_id, "pd", e.ttft_s, e.cached_tokens,
                        f"kv-aware: cost {c:.0f} tokens")


class GoodputPolicy(RoutingPolicy):
    """Every candidate path — local on a decode worker (any turn, no handoff), the warm tier,
    the cold tier, on each worker of those roles — with its predicted TTFT and TPOT; the one
    keeping the most requests within their class targets (``routing/goodput.py``)."""

    name = "goodput"
    decides_local = True
    roles = ("pre-prefill", "prefill", "decode", "replica")

    def __init__(self, cfg: GoodputConfig = GoodputConfig()) -> None:
        self.cfg = cfg
        self.cold_rule = ColdRule(cfg.cold_threshold, cfg.min_cached_tokens)
        self.computes_anywhere = cfg.local   # its local paths compute any prompt on a decode-type worker

    def route(self, req: RequestView, snap: Snapshot, allow_local: bool = True) -> Decision:
        preds = paths(req, snap, self.cfg, allow_local)
        cls = self.cold_rule.label(reuse(req, snap), req.num_tokens)
        got = choose(score(req, snap, self.cfg, cls, preds), snap.session_decode_worker)
        p, wait = got.pred, hold_s(got, req, self.cfg, cls)
        reason = (f"{cls}: {p.path} keeps {got.kept} (of {len(preds)} paths); TTFT {p.ttft_s:.3f}s, TPOT "
                  f"{p.tpot_s * 1e3:.1f}ms, {p.running} running at {p.running_tpot_s * 1e3:.1f}ms; harm {got.harm_s:.3f}s"
                  + (f"; held {req.waited_s:.2f}s" if req.waited_s else "") + (f"; hold {wait:.2f}s" if wait else ""))
        return Decision(p.prefill, p.decode, p.path, p.ttft_s, p.cached_tokens, reason, cls=cls,
                        est_tpot_s=p.tpot_s, est_running_tpot_s=p.running_tpot_s, est_tpot_parts=p.tpot_parts,
                        est_ttft_parts=p.ttft_parts, est_handoff_load_s=p.handoff_s, hold_s=wait)


POLICIES = {"cpd": CPDPolicy, "pd": PDPolicy, "pd-kv": PDKVPolicy, "replica": ReplicaPolicy, "goodput": GoodputPolicy}

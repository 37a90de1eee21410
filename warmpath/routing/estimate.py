"""TTFT estimate of a candidate prefill worker (pure), from the router's learnt model.

TTFT ≈ the router's hop + queue wait + load of the prefix it lacks locally (from L3 only
when loading it and computing the rest beats computing it all) + compute of the new tokens
(context-dependent) + the write-through of the blocks the store lacks (the P→D handoff the
prefill reply waits for). Every term comes from :class:`~warmpath.routing.latency.RouterModel`
lines fitted to the workers' replies, or the worker's heartbeat speeds before any.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.routing.latency import WorkerModel
from warmpath.routing.views import PrefixHit, RequestView, Snapshot, WorkerView


@dataclass(frozen=True)
class Estimate:
    ttft_s: float
    cached_tokens: int
    queue_s: float
    load_s: float
    compute_s: float
    handoff_s: float


def worker_model(w: WorkerView, snap: Snapshot) -> WorkerModel:
    return snap.model.of(w) if snap.model is not None else WorkerModel.prior(w)


def estimate(w: WorkerView, req: RequestView, snap: Snapshot, handoff: bool = True) -> Estimate:
    """Estimated TTFT if ``w`` prefills ``req`` (``handoff``: KV then goes to a decode worker)."""
    m = worker_model(w, snap)
    hit = snap.hits.get(w.worker_id, PrefixHit())
    n, bs, per_tok = req.num_tokens, req.block_size, snap.kv_bytes_per_token
    max_cached = n - 1                                     # the last token is always computed
    local = min(hit.local_blocks * bs, max_cached)
    l3 = max(0, min(hit.l3_blocks * bs, max_cached - local))
    load_local = local * per_tok / w.l2_bytes_s            # L1 hits are free; L2 is the bound
    l3_load = m.l3_read.seconds(l3 * per_tok) if l3 else 0.0
    use_l3 = l3 > 0 and l3_load + m.compute_s(n - local - l3, local + l3) < m.compute_s(n - local, local)
    cached = local + (l3 if use_l3 else 0)
    queue = m.queue_s(w.queued_prefill_tokens)
    compute = m.compute_s(n - cached, cached)
    load = load_local + (l3_load if use_l3 else 0.0)
    unstored = max(0, (n // bs) * bs - cached)             # full blocks the store does not hold yet
    hand = m.l3_write.seconds(unstored * per_tok) if handoff and unstored else 0.0
    hop = snap.model.hop_s.value if snap.model is not None else 0.0
    return Estimate(hop + queue + load + compute + hand, cached, queue, load, compute, hand)


def best(workers: list[WorkerView], req: RequestView, snap: Snapshot, handoff: bool = True,
         last_routed: dict[str, int] | None = None, near: float = 0.0) -> tuple[WorkerView, Estimate] | None:
    """Lowest estimated TTFT. Ties — exact, or within ``near`` (a share) of the lowest, where
    the difference is smaller than the learnt lines' own error — go to the fewest queued
    tokens, then the fewest running, then the least recently routed per ``last_routed``
    (worker -> a rising count; never routed first), then the lowest TTFT, then id."""
    scored = [(estimate(w, req, snap, handoff), w) for w in workers]
    if not scored:
        return None
    last = last_routed or {}
    low = min(e.ttft_s for e, _ in scored)
    tied = [p for p in scored if p[0].ttft_s <= low * (1.0 + near)]
    e, w = min(tied, key=lambda p: (p[0].ttft_s if near == 0.0 else 0.0, p[1].queued_prefill_tokens,
                                    p[1].running, last.get(p[1].worker_id, -1), p[0].ttft_s, p[1].worker_id))
    return w, e


def least_loaded_decode(workers: list[WorkerView]) -> WorkerView | None:
    """Decode worker with the fewest running sequences (then lowest KV usage, then id)."""
    if not workers:
        return None
    return min(workers, key=lambda w: (w.running, w.kv_usage, w.worker_id))


def tier_class(w: WorkerView) -> str:
    """The class of request a worker's tier is for: pre-prefill → cold, prefill → warm."""
    return "cold" if w.role == "pre-prefill" else "warm"


def harm_s(w: WorkerView, e: Estimate, snap: Snapshot) -> float:
    """Expected delay ``e``'s work (c) adds to later requests at ``w``: the requests of its
    tier's class arriving there (λ per worker of the tier) while the queue ahead of it (q)
    drains wait c more each, those arriving during c wait c/2 on average: λ·c·(q + c/2)."""
    tier = [x for x in snap.workers if x.role == w.role]
    lam = snap.arrivals_s.get(tier_class(w), 0.0) / max(1, len(tier))
    busy = e.compute_s + e.load_s
    return lam * busy * (e.queue_s + busy / 2)

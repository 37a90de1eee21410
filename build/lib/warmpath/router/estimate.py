"""TTFT estimate of a candidate prefill worker (pure).

TTFT ≈ queue wait + load of the prefix it lacks locally (the cheaper of loading it from L3
and recomputing it) + compute of the new tokens + the P→D handoff.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.router.state import PrefixHit, RequestView, Snapshot, WorkerView


@dataclass(frozen=True)
class Estimate:
    ttft_s: float
    cached_tokens: int
    queue_s: float
    load_s: float
    compute_s: float
    handoff_s: float


def estimate(w: WorkerView, req: RequestView, snap: Snapshot, handoff: bool = True) -> Estimate:
    """Estimated TTFT if ``w`` prefills ``req`` (``handoff``: KV then goes to a decode worker)."""
    hit = snap.hits.get(w.worker_id, PrefixHit())
    bs = req.block_size
    max_cached = req.num_tokens - 1                        # the last token is always computed
    local = min(hit.local_blocks * bs, max_cached)
    l3 = max(0, min(hit.l3_blocks * bs, max_cached - local))
    per_tok = snap.kv_bytes_per_token
    load_local = local * per_tok / w.l2_bytes_s            # L1 hits are free; L2 is the bound
    l3_load, l3_recompute = l3 * per_tok / w.l3_bytes_s, l3 / w.prefill_tok_s
    use_l3 = l3 > 0 and l3_load < l3_recompute
    cached = local + (l3 if use_l3 else 0)
    queue = w.queued_prefill_tokens / w.prefill_tok_s
    compute = (req.num_tokens - cached) / w.prefill_tok_s
    load = load_local + (l3_load if use_l3 else 0.0)
    hand = req.num_tokens * per_tok / snap.network_bytes_s if handoff else 0.0
    return Estimate(queue + load + compute + hand, cached, queue, load, compute, hand)


def best(workers: list[WorkerView], req: RequestView, snap: Snapshot,
         handoff: bool = True) -> tuple[WorkerView, Estimate] | None:
    """Lowest estimated TTFT (ties: fewest queued tokens, then id)."""
    scored = [(estimate(w, req, snap, handoff), w) for w in workers]
    if not scored:
        return None
    e, w = min(scored, key=lambda p: (p[0].ttft_s, p[1].queued_prefill_tokens, p[1].worker_id))
    return w, e


def least_loaded_decode(workers: list[WorkerView]) -> WorkerView | None:
    """Decode worker with the fewest running sequences (then lowest KV usage, then id)."""
    if not workers:
        return None
    return min(workers, key=lambda w: (w.running, w.kv_usage, w.worker_id))

"""Index fidelity: the share of a vLLM server's cached blocks (by its own events) that the
router's KV index holds for that worker, sampled while traffic runs (issue 30: ≥ 99%).

One sample of one worker (``benchmarks/peers/vllm_fidelity.py`` takes them):

1. read the worker's ``GET /internal/kv/cached`` (:class:`~warmpath.protocol.internal.CachedBlocks`);
2. ask the router ``POST /internal/kv/held`` with those warmpath keys;
3. read the worker again.

Only blocks cached in both reads count (:func:`stable`): one evicted between the reads is
no loss of the index's, while one stored before the first read and not yet in the index
when it is asked is (relay lag is a real miss). A block the relay could not re-key (unknown
parent, another block size) counts as cached and not held. Where the relay lost batches
(``lost_batches``), the truth misses their blocks too: samples carry the count.

NOTE: no torch, no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from warmpath.stats import percentile


def fidelity(truth: int, held: int) -> float | None:
    """``held / truth``: the share of ``truth`` cached blocks that the index holds; ``None``
    when nothing is cached (no share to measure)."""
    if truth < 0 or held < 0 or held > truth:
        raise ValueError(f"fidelity: need 0 <= held <= truth, got held={held}, truth={truth}")
    return held / truth if truth else None


def stable(first: dict, second: dict) -> tuple[dict[str, int], int]:
    """Blocks cached in both of two :class:`CachedBlocks` reads: warmpath key hex → how many
    (the smaller count of the two), and how many un-keyed vLLM hashes both name."""
    k1, k2 = first["keys"], second["keys"]
    keys = {k: min(n, k2[k]) for k, n in k1.items() if k in k2}
    return keys, len(set(first["unkeyed"]) & set(second["unkeyed"]))


@dataclass(frozen=True)
class Sample:
    """One worker at one time: ``truth`` cached blocks (``unkeyed`` of them never re-keyed),
    ``held`` of them in the router's index, ``share`` (``None`` when ``truth`` is 0)."""

    t: float
    worker: str
    truth: int
    held: int
    unkeyed: int
    share: float | None
    stale: bool = False            # the router saw the worker's events stop
    lost_batches: int = 0          # the relay's, so far
    mirror_mismatch: int = 0       # the router's lookup mirror disagreed with its own sets


def sample(t: float, first: dict, asked: list[str], reply: dict, second: dict) -> Sample:
    """A :class:`Sample` from the two reads, the keys asked (in order) and the router's
    :class:`~warmpath.protocol.internal.HeldReply` (``missing``: positions in ``asked``)."""
    keys, unkeyed = stable(first, second)
    gone = {asked[i] for i in reply["missing"]}
    held = sum(n for k, n in keys.items() if k not in gone)
    truth = sum(keys.values()) + unkeyed
    return Sample(t, first["worker_id"], truth, held, unkeyed, fidelity(truth, held), reply.get("stale", False),
                  second.get("lost_batches", 0), reply.get("mirror_mismatch", 0))


def _shares(samples: list[Sample]) -> dict:
    xs = [s.share for s in samples if s.share is not None]
    r = (lambda v: None if v is None else round(v, 6))
    return {"samples": len(xs), "min": r(min(xs, default=None)), "p1": r(percentile(xs, 1)),
            "median": r(percentile(xs, 50)), "mean": r(sum(xs) / len(xs) if xs else None)}


def summarize(samples: list[Sample]) -> dict:
    """Min, p1, median and mean share over the samples with blocks cached (all workers, then
    each), the blocks summed over them, and the worst sample; ``samples``: every sample."""
    live = [s for s in samples if s.truth > 0]
    per = Counter(s.worker for s in samples)
    worst = min(live, key=lambda s: s.share, default=None)
    return {"all": _shares(live) | {"truth_blocks": sum(s.truth for s in live),
                                    "held_blocks": sum(s.held for s in live),
                                    "unkeyed_blocks": sum(s.unkeyed for s in live)},
            "workers": {w: _shares([s for s in live if s.worker == w]) for w in sorted(per)},
            "empty_samples": len(samples) - len(live), "stale_samples": sum(s.stale for s in samples),
            "lost_batches": sum(max(s.lost_batches for s in samples if s.worker == w) for w in per),
            "mirror_mismatch": sum(s.mirror_mismatch for s in samples),
            "worst": asdict(worst) if worst else None, "samples": [asdict(s) for s in samples]}

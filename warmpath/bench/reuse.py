"""The one rule that classes a request cold or warm, and its turn, from measured reuse
(bench and simulator both import it; no torch).

A request is *warm* when at least :data:`WARM_SHARE` of its prompt was reused — the cached
tokens the server reported for it (``usage.prompt_tokens_details.cached_tokens``), or in the
simulator what the simulated cache gave it — and *cold* otherwise. When no measurement
exists (a server that does not report cached tokens, a request that failed) the reuse is
its prefix overlap with the prompts sent before it, in full blocks (:class:`PrefixOverlap`).
A workload's own label never decides. Its *turn* is the session's turn (turn k of a
multi-turn session); a one-turn request (a trace row) that extends an earlier prompt by
at least one token continues that conversation: its turn is one more than that prompt's.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from typing import Hashable, Sequence

import xxhash

WARM_SHARE = 0.5          # warm: at least half of the prompt reused
OVERLAP_BLOCK = 16        # tokens per block of the overlap fallback (warmpath's KV block)


def reuse_class(prompt_tokens: int, reused_tokens: int) -> str:
    """``"warm"`` if ``reused_tokens`` is at least :data:`WARM_SHARE` of the prompt, else ``"cold"``."""
    return "warm" if prompt_tokens > 0 and reused_tokens >= WARM_SHARE * prompt_tokens else "cold"


def measured_class(prompt_tokens: int, cached_tokens: int | None, overlap_tokens: int) -> tuple[str, str]:
    """(class, what measured it): the reported ``cached_tokens`` when there is one
    (``"cached"``), else the prefix overlap (``"overlap"``)."""
    if cached_tokens is None:
        return reuse_class(prompt_tokens, overlap_tokens), "overlap"
    return reuse_class(prompt_tokens, cached_tokens), "cached"


def block_hashes(tokens: Sequence[int], block: int = OVERLAP_BLOCK) -> list[bytes]:
    """Chained hashes of every full ``block``-token block: hash i covers tokens up to the
    end of block i (equal hashes = equal prefixes). Mooncake traces' ``hash_ids`` become equal
    token blocks (``workload.block_tokens``), so shared ids give shared hashes here."""
    n = len(tokens) // block
    buf = array("I", tokens[:n * block]).tobytes()
    step, parent, out = 4 * block, b"", []
    for off in range(0, len(buf), step):
        parent = xxhash.xxh3_64_digest(parent + buf[off:off + step])
        out.append(parent)
    return out


@dataclass(frozen=True)
class Overlap:
    """A prompt against the prompts sent before it: tokens of its longest shared prefix
    (full blocks) and its turn (1 + the turn of the longest earlier prompt it extends)."""

    tokens: int
    turn: int


class PrefixOverlap:
    """Prompts seen so far, as chained block hashes (any chained hash of ``block``-token
    blocks: :func:`block_hashes`, or the simulator's KV block hashes).

    Memory is bounded: beyond ``max_blocks`` distinct blocks the oldest are forgotten.
    """

    def __init__(self, block: int = OVERLAP_BLOCK, max_blocks: int = 1 << 21) -> None:
        if block < 1 or max_blocks < 1:
            raise ValueError(f"block and max_blocks must be >= 1, got {block}, {max_blocks}")
        self.block, self.max_blocks = block, max_blocks
        self._seen: set[Hashable] = set()
        self._order: deque = deque()
        self._ends: dict[Hashable, tuple[int, int]] = {}   # last block hash -> (prompt tokens, turn)

    def observe(self, hashes: Sequence[Hashable], prompt_tokens: int, turn: int | None = None) -> Overlap:
        """Measure one prompt being sent (``hashes``: its chained block hashes), then remember
        it. ``turn``: the session's turn when known (else derived from the prompts it extends)."""
        # NOTE: hash i seen implies hashes 0..i seen (chained, all of a prompt's are added),
        # so the shared prefix is found by bisection.
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in self._seen:
                lo = mid
            else:
                hi = mid - 1
        if turn is None:
            turn = 1
            ends = self._ends.keys() & set(hashes[:lo])
            done = [self._ends[h] for h in ends if self._ends[h][0] < prompt_tokens]
            if done:
                turn = max(done)[1] + 1
        for h in hashes[lo:]:
            self._seen.add(h)
            self._order.append(h)
        while len(self._order) > self.max_blocks:
            self._seen.discard(self._order.popleft())
        if hashes:
            self._ends[hashes[-1]] = (prompt_tokens, turn)
        return Overlap(lo * self.block, turn)

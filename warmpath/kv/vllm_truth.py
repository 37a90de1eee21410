"""What a vLLM server has cached, by its own event stream: the truth that the router's index
is measured against (index fidelity, ``vllm/fidelity.py``).

:class:`VLLMCacheTruth` folds vLLM's decoded events (``kv/vllm_events.py``, vLLM's opaque
hashes and media) as vLLM means them, whether or not warmpath could re-key them:

* ``BlockStored`` adds one reference to each (hash, tier); ``BlockRemoved`` takes one away.
  vLLM's hash → block map is a multimap (``BlockHashToBlockMap``: two requests that computed
  the same prefix at once cache two blocks under one hash), each insertion sends a
  ``BlockStored`` and each eviction a ``BlockRemoved``, so a hash is cached while its count
  is above zero. (vLLM's per-request ``kv_cache_report_mode="full"`` re-sends ``BlockStored``
  for reused blocks and would over-count; warmpath's relay never asks for it.)
* ``AllBlocksCleared`` forgets everything.
* A block is cached while any tier warmpath indexes (``MEDIA``: L1, L2) holds it; events of
  other media are counted in ``other_medium`` and left out, as the relay leaves them out.
* Each cached block keeps the warmpath key the rebuilder gave its hash (``None``: it could
  not: an unknown parent, another block size, bad tokens).

Cost: one dict update per block of an event (and a lock per batch); :meth:`snapshot` is the
only O(cached blocks) call, made when asked. Thread-safe: the relay's thread applies, the
HTTP face reads.

NOTE: no torch, no I/O.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Callable

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.vllm_events import MEDIA


def block_id(h: bytes | int) -> str:
    """A vLLM block hash as text: hex of its bytes, or the decimal of an (older) int hash."""
    return h.hex() if isinstance(h, bytes) else str(h)


class VLLMCacheTruth:
    """vLLM's cached blocks from its events (see the module notes)."""

    def __init__(self) -> None:
        self._refs: dict[tuple, int] = {}          # (vLLM hash, tier) → blocks cached under it
        self._tiers: dict = {}                     # vLLM hash → tiers holding it (> 0)
        self._keys: dict = {}                      # vLLM hash → warmpath key | None, while cached
        self._lock = threading.Lock()
        self.other_medium = 0                      # blocks of events in media not indexed
        self.unmatched_removes = 0                 # removals of a hash not cached here

    def apply(self, events: list, key_of: Callable[[bytes | int], bytes | None]) -> None:
        """Fold one batch of vLLM's decoded events; ``key_of``: vLLM hash → warmpath key or
        ``None`` (the rebuilder's map, read after it translated the same batch)."""
        with self._lock:
            for e in events:
                if isinstance(e, AllBlocksCleared):
                    self._refs.clear()
                    self._tiers.clear()
                    self._keys.clear()
                    continue
                tier = MEDIA.get(e.medium) if isinstance(e.medium, (str, type(None))) else None
                if tier is None:
                    self.other_medium += len(e.block_hashes)
                elif isinstance(e, BlockStored):
                    for h in e.block_hashes:
                        self._store(h, tier, key_of(h))
                elif isinstance(e, BlockRemoved):
                    for h in e.block_hashes:
                        self._remove(h, tier)

    def _store(self, h, tier: str, key: bytes | None) -> None:
        n = self._refs.get((h, tier), 0)
        self._refs[(h, tier)] = n + 1
        if n == 0:
            self._tiers[h] = self._tiers.get(h, 0) + 1
        if key is not None or h not in self._keys:   # a later store that could not key it keeps the key
            self._keys[h] = key

    def _remove(self, h, tier: str) -> None:
        n = self._refs.get((h, tier), 0)
        if n == 0:
            self.unmatched_removes += 1
            return
        if n > 1:
            self._refs[(h, tier)] = n - 1
            return
        del self._refs[(h, tier)]
        if self._tiers[h] > 1:
            self._tiers[h] -= 1
            return
        del self._tiers[h]
        del self._keys[h]

    def __len__(self) -> int:
        return len(self._keys)

    def snapshot(self) -> dict:
        """Now: ``blocks`` (vLLM's cached blocks, distinct hashes), ``keys`` (warmpath key hex →
        how many of them have it), ``unkeyed`` (vLLM hashes of the others, :func:`block_id`),
        ``other_medium`` and ``unmatched_removes`` (counts since the start)."""
        with self._lock:
            items = list(self._keys.items())
            other, unmatched = self.other_medium, self.unmatched_removes
        keys = Counter(k.hex() for _, k in items if k is not None)
        unkeyed = [block_id(h) for h, k in items if k is None]
        return {"blocks": len(items), "keys": dict(keys), "unkeyed": unkeyed,
                "other_medium": other, "unmatched_removes": unmatched}

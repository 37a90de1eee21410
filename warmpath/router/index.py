"""The router's global KV index, fed by workers' KV events, with a TTL fallback.

Exact mode: per worker, the set of block hashes it holds in L1/L2 (from ``BlockStored`` /
``BlockRemoved`` events), plus one cluster-wide set for L3. When a worker's events stop
(no batch for ``stale_after_s`` while it still heartbeats), the router switches that worker
to approximate mode: it assumes a worker holds what the router last sent it, for ``ttl_s``.

Lookup by binary search. A worker *can* hold block i without block i-1 (L1/L2 evict single
blocks, an L3 write can fail for one block of a chain, routed hints are capped oldest
first), so "held" is not monotone along a chain and a plain binary search over it could skip
a gap. The planner's prefix hit is the leading run, up to the first missing block (what an
engine can reuse). So each worker (and L3) also has a *certified* set: hashes whose whole
chain prefix a lookup has seen held. It is

* a subset of the held set: a removal of a certified hash clears the certified set (stores
  never do: a held block stays held until removed);
* prefix-closed: a lookup adds ``hashes[v:n]`` only when ``hashes[:v]`` are certified and it
  has just seen ``hashes[v:n]`` held. A block hash covers its parent's hash, so equal hashes
  are equal chain prefixes at the same depth (up to xxh3-128 collisions, which the index's
  hash keys assume away already).

So "certified" is monotone along a request's chain: a binary search finds the certified run
``v`` in O(log n) probes, and only blocks after it are checked one by one (at C speed), each
certified then, once per certified-set lifetime. The result is the same leading run as
checking every block (``tests/router/test_index_exact.py`` checks it against that).
Memory: a certified set is never larger than its held set. The certified sets are
``kv.hashing.KeySet``s (16-byte keys stored inline, in C): certifying a 32K-token prompt's
2,048 blocks is the largest part of a cold lookup.

NOTE: no torch, no I/O; ``now`` is passed in so the simulator can drive time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import islice, takewhile

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.hashing import KeySet
from warmpath.router.views import PrefixHit


@dataclass
class GlobalKVIndex:
    stale_after_s: float = 30.0
    ttl_s: float = 120.0
    max_approx_blocks: int = 1 << 20          # per worker; the oldest routed hints go first
    local: dict[str, dict[bytes, set[str]]] = field(default_factory=lambda: defaultdict(dict))
    l3: set[bytes] = field(default_factory=set)
    approx: dict[str, dict[bytes, float]] = field(default_factory=lambda: defaultdict(dict))
    last_event: dict[str, float] = field(default_factory=dict)
    certified: dict[str, KeySet] = field(default_factory=dict)       # per worker, ⊆ local (see above)
    l3_certified: KeySet = field(default_factory=KeySet)             # ⊆ l3

    def apply(self, worker: str, events: list, now: float) -> None:
        """Fold one batch of a worker's events into the index."""
        self.last_event[worker] = now
        held = self.local[worker]
        for e in events:
            if isinstance(e, BlockStored):
                for h in e.block_hashes:
                    if e.medium == "L3":
                        self.l3.add(h)
                    else:
                        held.setdefault(h, set()).add(e.medium)
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    if e.medium == "L3":
                        self.l3.discard(h)
                        if h in self.l3_certified:
                            self.l3_certified.clear()
                    elif h in held:
                        held[h].discard(e.medium)
                        if not held[h]:
                            del held[h]
                            if h in self.certified.get(worker, ()):
                                self.certified[worker].clear()
            elif isinstance(e, AllBlocksCleared):
                held.clear()
                self.certified.pop(worker, None)

    def note_routed(self, worker: str, hashes: tuple[bytes, ...], now: float) -> None:
        """The router sent these blocks to ``worker`` (used while its events are stale)."""
        d = self.approx[worker]
        for h in hashes:
            d.pop(h, None)                     # re-inserted last: dict order is LRU order
            d[h] = now + self.ttl_s
        while len(d) > self.max_approx_blocks:
            del d[next(iter(d))]
        # NOTE: the oldest hints come first and, the clock moving forward, expire first:
        # drop those past their TTL (lookup ignores them) so the dict does not keep every
        # block ever routed until the cap.
        while d:
            first = next(iter(d))
            if d[first] >= now:
                break
            del d[first]

    def sizes(self) -> dict[str, int]:
        """Block hashes held per set: ``local`` (every worker's L1/L2), ``l3``, ``approx``."""
        return {"local": sum(len(d) for d in self.local.values()), "l3": len(self.l3),
                "approx": sum(len(d) for d in self.approx.values())}

    def drop_worker(self, worker: str) -> None:
        """Forget a dead worker's entries."""
        self.local.pop(worker, None)
        self.approx.pop(worker, None)
        self.last_event.pop(worker, None)
        self.certified.pop(worker, None)

    def is_stale(self, worker: str, now: float) -> bool:
        last = self.last_event.get(worker)
        return last is None or now - last > self.stale_after_s

    def lookup(self, worker: str, hashes: tuple[bytes, ...], now: float) -> PrefixHit:
        """Leading blocks ``worker`` holds locally, then how many more are in L3.

        ``hashes``: a request's chain from its first block (``kv/hashing.py``)."""
        held = self.local.get(worker, {})
        cert = self.certified.get(worker, ())
        v = _certified_run(cert, hashes)
        if self.is_stale(worker, now):
            approx = self.approx.get(worker, {})
            n = v
            for h in islice(hashes, v, None):
                if h in held or approx.get(h, float("-inf")) >= now:   # any clock, negative times too
                    n += 1
                else:
                    break
        else:
            n = _held_run(held, hashes, v)
            if n > v:
                if worker not in self.certified:
                    self.certified[worker] = KeySet()
                self.certified[worker].update(hashes[v:n])
        u = _certified_run(self.l3_certified, hashes)
        a = _held_run(self.l3, hashes, u)
        if a > u:
            self.l3_certified.update(hashes[u:a])
        return PrefixHit(n, (a if a >= n else _held_run(self.l3, hashes, n)) - n)


def _certified_run(cert, hashes: tuple[bytes, ...]) -> int:
    """Length of the leading run of ``hashes`` in the prefix-closed ``cert`` (binary search)."""
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi) // 2
        if hashes[mid] in cert:
            lo = mid + 1
        else:
            hi = mid
    return lo


_RUN_CHUNK = 256   # blocks a set checks in one C call (issuperset) before a chunk with a gap is scanned


def _held_run(held, hashes: tuple[bytes, ...], start: int) -> int:
    """First index from ``start`` on whose hash is not in ``held`` (a C-level scan).

    A set (L3) is checked a chunk at a time by ``issuperset`` (no Python call per block);
    the chunk with the first gap, and a dict (a worker's L1/L2), by ``takewhile``."""
    n = len(hashes)
    if start >= n or hashes[start] not in held:
        return start
    if isinstance(held, set):
        while start < n and held.issuperset(islice(hashes, start, start + _RUN_CHUNK)):
            start += _RUN_CHUNK
        if start >= n:
            return n
    return start + len(list(takewhile(held.__contains__, islice(hashes, start, None))))

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
checking every block (``tests/routing/test_index_exact.py`` checks it against that).
Memory: a certified set is never larger than its held set.

With the C extension (``kv.hashing.NATIVE``) every set a lookup probes is a C
``kv.hashing.KeySet`` (16-byte keys stored inline): the certified sets, and *mirrors* of the
held sets (``held_keys``: per worker, the keys ``local`` holds in any tier; ``l3_keys``: the
keys of ``l3``), kept in step by :meth:`GlobalKVIndex.apply`. A lookup is then a few C calls
(``kv/keyruns.py``) that never make or hash a Python object per block: a cold 32K-token
prompt probes ~3,000 keys and certifies them. ``local`` and ``l3`` stay the truth (and what
the rest of the code reads); a mirror costs 17 bytes a slot, 2-4 slots a key, and ~20-40 ns
a stored or removed key in ``apply``. Without the extension the lookups probe ``local`` and
``l3`` themselves (same answers, Python speed).

NOTE: no torch, no I/O; ``now`` is passed in so the simulator can drive time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.hashing import NATIVE, KeySet
from warmpath.kv.keyruns import certify, closed_run, run
from warmpath.routing.views import PrefixHit

_NOTHING = KeySet()     # a worker with no mirror yet holds nothing (never written)


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
    held_keys: dict[str, KeySet] = field(init=False, default_factory=dict)   # keys of local[w] (NATIVE only)
    l3_keys: KeySet = field(init=False, default_factory=KeySet)              # keys of l3 (NATIVE only)

    def apply(self, worker: str, events: list, now: float) -> None:
        """Fold one batch of a worker's events into the index."""
        self.last_event[worker] = now
        held = self.local[worker]
        keys = self.held_keys.get(worker) if NATIVE else None
        if NATIVE and keys is None:
            keys = self.held_keys[worker] = KeySet()
        for e in events:
            if isinstance(e, BlockStored):
                if e.medium == "L3":
                    self.l3.update(e.block_hashes)
                    if NATIVE:
                        self.l3_keys.absorb(e.block_hashes)
                    continue
                for h in e.block_hashes:
                    held.setdefault(h, set()).add(e.medium)
                if NATIVE:
                    keys.absorb(e.block_hashes)
            elif isinstance(e, BlockRemoved) and e.medium == "L3":
                self.l3.difference_update(e.block_hashes)
                if NATIVE:
                    self.l3_keys.discard_all(e.block_hashes)
                if any(map(self.l3_certified.__contains__, e.block_hashes)):
                    self.l3_certified.clear()
            elif isinstance(e, BlockRemoved):
                gone = []
                for h in e.block_hashes:
                    if h in held:
                        held[h].discard(e.medium)
                        if not held[h]:
                            del held[h]
                            gone.append(h)
                if NATIVE:
                    keys.discard_all(gone)
                if any(map(self.certified.get(worker, ()).__contains__, gone)):
                    self.certified[worker].clear()
            elif isinstance(e, AllBlocksCleared):
                held.clear()
                if NATIVE:
                    keys.clear()
                self.certified.pop(worker, None)

    def note_routed(self, worker: str, hashes: Sequence[bytes], now: float) -> None:
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

    def missing(self, worker: str, keys: list[bytes]) -> tuple[list[int], int]:
        """Positions in ``keys`` that ``worker``'s own tiers (L1 / L2, from its events) do not
        hold as lookups probe them (the C mirror with the extension), and how many of ``keys``
        the mirror and ``local`` disagree on (0 unless the bookkeeping broke). Routed hints
        (``approx``) do not count: index fidelity (``vllm/fidelity.py``) measures the events."""
        local = self.local.get(worker, {})
        probe = self.held_keys.get(worker, _NOTHING) if NATIVE else local
        gaps = [i for i, k in enumerate(keys) if k not in probe]
        split = sum((k in probe) != (k in local) for k in keys) if NATIVE else 0
        return gaps, split

    def drop_worker(self, worker: str) -> None:
        """Forget a dead worker's entries."""
        self.local.pop(worker, None)
        self.held_keys.pop(worker, None)
        self.approx.pop(worker, None)
        self.last_event.pop(worker, None)
        self.certified.pop(worker, None)

    def is_stale(self, worker: str, now: float) -> bool:
        last = self.last_event.get(worker)
        return last is None or now - last > self.stale_after_s

    def lookup(self, worker: str, hashes: Sequence[bytes], now: float) -> PrefixHit:
        """Leading blocks ``worker`` holds locally, then how many more are in L3.

        ``hashes``: a request's chain from its first block (``kv/hashing.py``): a tuple, a list
        or a ``kv.keychain.KeyChain`` (the C lookups read its buffer: no object per block)."""
        cert = self.certified.get(worker)
        v = closed_run(cert, hashes) if cert is not None else 0
        if self.is_stale(worker, now):
            held, approx = self.local.get(worker, {}), self.approx.get(worker, {})
            n = v
            for h in islice(hashes, v, None):
                if h in held or approx.get(h, float("-inf")) >= now:   # any clock, negative times too
                    n += 1
                else:
                    break
        else:
            keys = self.held_keys.get(worker, _NOTHING) if NATIVE else self.local.get(worker, {})
            new = cert is None
            if new:
                cert = KeySet()
            n = certify(cert, keys, hashes, v)
            if new and n:
                self.certified[worker] = cert
        l3 = self.l3_keys if NATIVE else self.l3
        u = closed_run(self.l3_certified, hashes)
        a = certify(self.l3_certified, l3, hashes, u)
        return PrefixHit(n, (a if a >= n else run(l3, hashes, n)) - n)

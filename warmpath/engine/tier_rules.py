"""The lower KV tiers' decisions, written once for the engine and the simulator (pure, no torch).

The seams it works between are in ``tier_seams.py``: the scheduler's
(:class:`ExternalPrefixSource`) and the byte mover's (:class:`TierMover`: ``engine/tiered_kv.py``
moves torch tensors through host DRAM and Mooncake; ``sim/tier_mover.py`` models the same moves).

* :class:`TierRules`: what moves when. L1 eviction demotes the block into L2 (the L2 victim
  goes to L3 under write-back); every sealed L1 block goes to L3 under write-through (put
  at the step's flush); a lookup below L1 loads the leading L2 run, then the L3 run, each
  only where the cost model says loading beats recomputing; a failed load is recomputed.
  Every change is a KV event, published at the flush; L3 blocks are announced exactly as
  the store accepted them and withdrawn when the mover finds them gone.
* Overlapped loads (over a mover that :attr:`~TierMover.overlaps_loads`): a
  load with an L3 part runs beside the steps; the scheduler keeps its sequence out of the
  batches until :meth:`TierRules.landed` returns it, so the running decodes go on instead of
  waiting for the store (a P->D handoff's whole prompt, on the decode worker).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from warmpath.engine.sequence import Sequence
from warmpath.engine.tier_seams import ExternalPrefixSource, LoadResult, TierMover, TierStats
from warmpath.kv.block_pool import BlockPool, KVBlock
from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.load_cost import LoadCostModel

WRITE_MODES = ("write-through", "write-back", "none")


def write_mode_for(role: str, current: str | None = None) -> str:
    """When a worker of ``role`` writes blocks to L3: a replica keeps its blocks until
    evicted (write-back; ``current`` if it has one already); every other role hands KV to
    another worker through the store, so each sealed block goes at once (write-through).
    A worker whose role changes (elastic roles) moves to write-through, never off it;
    ``none`` stays ``none``."""
    if current == "none":
        return "none"
    if role == "replica":
        return current or "write-back"
    return "write-through"


@dataclass
class _Load:
    seq: Sequence
    first_block: int
    n_l2: int
    n_l3: int
    first: bool      # planned at the sequence's first schedule (counted as its cache hit)


class TierRules(ExternalPrefixSource):
    """The tier decisions of one worker, over any :class:`TierMover`.

    ``publish`` receives each flush's event batch. ``tokens_in_events``: L1 stores carry
    their token ids (the engine's wire format) or not (the simulator; then consecutive
    events of one kind and tier are merged). ``l3_record`` bounds the LRU record of hashes
    this worker announced as in L3 (checked by :meth:`check_l3`).
    """

    def __init__(self, mover: TierMover, pool: BlockPool, block_size: int, write_mode: str,
                 cost: LoadCostModel, publish: Callable[[list], None] | None,
                 tokens_in_events: bool = True, l3_record: int = 1 << 16) -> None:
        if write_mode not in WRITE_MODES:
            raise ValueError(f"write_mode must be write-through, write-back or none, got {write_mode!r}")
        self.mover, self.bs, self.write_mode, self.cost = mover, block_size, write_mode, cost
        self.publish, self.tokens_in_events, self.l3_record = publish, tokens_in_events, l3_record
        self.stats = TierStats()
        self.l3_known: OrderedDict[bytes, None] = OrderedDict()
        self._events: list = [AllBlocksCleared()]   # true at start: L1 and L2 hold nothing
        self._plans: dict[str, tuple[int, int]] = {}
        self._loads: list[_Load] = []
        self._inflight: list[tuple[_Load, object]] = []   # overlapped loads and their movers' handles
        self._to_put: list[KVBlock] = []
        pool.add_seal_hook(self.on_seal)
        pool.add_evict_hook(self.on_l1_evict)

    # -- scheduler seam ------------------------------------------------------
    def lookup(self, seq: Sequence, num_local_blocks: int) -> int:
        hashes = seq.full_block_hashes()[:(seq.num_tokens - 1) // self.bs][num_local_blocks:]
        m = self.mover
        n2, n3 = self.cost.choose_loads(hashes, m.count_l2, m.count_l3 if m.has_l3 else None,
                                m.block_bytes, self.bs)
        if n2 + n3:
            self._plans[seq.request_id] = (n2, n3)
        return n2 + n3

    def schedule_load(self, seq: Sequence, first_block: int, num_blocks: int) -> None:
        n2, n3 = self._plans.pop(seq.request_id)
        assert n2 + n3 == num_blocks
        first = seq.num_cached_tokens < 0
        if first:   # the scheduler counts the hit right after this call
            seq.cached_by_tier["L2"] += n2 * self.bs
            seq.cached_by_tier["L3"] += n3 * self.bs
        ld = _Load(seq, first_block, n2, n3, first)
        if self._overlapped(n3):
            self._inflight.append((ld, self.mover.start_load(seq, first_block, n2, n3)))
        else:
            self._loads.append(ld)

    def cancel(self, seq: Sequence) -> None:
        self._plans.pop(seq.request_id, None)

    def _overlapped(self, n_l3: int) -> bool:
        return bool(n_l3) and self.mover.overlaps_loads

    def defers(self, seq: Sequence) -> bool:
        """Whether the planned load of ``seq`` runs beside the steps: it has an L3 part and
        the mover overlaps loads (an L2-only load is a memory copy: it stays in the step)."""
        plan = self._plans.get(seq.request_id)
        return plan is not None and self._overlapped(plan[1])

    def landed(self) -> list[Sequence]:
        """Sequences whose overlapped loads finished, accounted as a step's loads are."""
        if not self._inflight:
            return []
        out, still = [], []
        for ld, handle in self._inflight:
            got = self.mover.poll_load(handle)
            if got is None:
                still.append((ld, handle))
                continue
            self._account_load(ld, got)
            out.append(ld.seq)
        self._inflight = still
        return out

    @property
    def loads_in_flight(self) -> int:
        """Overlapped loads not landed yet."""
        return len(self._inflight)

    def wait_loads(self, timeout_s: float) -> None:
        """Nothing else to do: block until an overlapped load may have landed."""
        if self._inflight:
            self.mover.wait_loads([h for _, h in self._inflight], timeout_s)

    # -- engine hooks --------------------------------------------------------
    def apply_loads(self) -> None:
        """Fill the blocks planned this step; roll progress back where a load fails."""
        loads, self._loads = self._loads, []
        for ld in loads:
            got = self.mover.load(ld.seq, ld.first_block, ld.n_l2, ld.n_l3)
            self._account_load(ld, got)

    def _account_load(self, ld: _Load, got: LoadResult) -> None:
        bb, bs = self.mover.block_bytes, self.bs
        if got.l2_s is not None:
            self.cost.observe_transfer("L2", got.l2 * bb, got.l2_s)
        if got.l3_s is not None:
            self.cost.observe_transfer("L3", got.l3 * bb, got.l3_s)
            ld.seq.l3_load_s += got.l3_s
        self.stats.l2_hits += got.l2
        self.stats.l3_loaded += got.l3
        self.stats.loaded_tokens["L2"] += got.l2 * bs
        self.stats.loaded_tokens["L3"] += got.l3 * bs
        hashes = ld.seq.full_block_hashes()
        start = ld.first_block + got.l2
        self._note_in_l3(hashes[start:start + got.l3])
        self._refused(got.rejected)
        seq, lost2, lost3 = ld.seq, ld.n_l2 - got.l2, ld.n_l3 - got.l3
        if lost2 + lost3:
            self.stats.load_failures += lost2 + lost3
            seq.num_computed_tokens -= (lost2 + lost3) * bs
            if ld.first:
                seq.num_cached_tokens -= (lost2 + lost3) * bs
                seq.cached_by_tier["L2"] -= lost2 * bs
                seq.cached_by_tier["L3"] -= lost3 * bs

    def _refused(self, rejected: list[tuple[str, bytes, str]]) -> None:
        """Count refused blocks; announce those no longer where this worker said they were."""
        for tier, h, reason in rejected:
            key = (tier, reason)
            self.stats.verify_failures[key] = self.stats.verify_failures.get(key, 0) + 1
            if tier == "L3":
                self.l3_gone([h])
            elif not self.mover.in_l2(h):   # the mover dropped a broken block
                self._event(False, "L2", [h])

    def on_seal(self, blk: KVBlock) -> None:
        """An L1 block became full and hashed: announce it; write-through queues it for L3."""
        self._event(True, "L1", [blk.block_hash], list(blk.token_ids) if self.tokens_in_events else None)
        if self.write_mode == "write-through" and self.mover.has_l3:
            self._to_put.append(blk)

    def on_l1_evict(self, blk: KVBlock) -> None:
        """L1 drops a cached block: announce it and demote it into L2 (write-back sends
        L2's victim to L3 first, while its bytes are still there)."""
        h, m = blk.block_hash, self.mover
        self.stats.l1_evictions += 1
        self._event(False, "L1", [h])
        if m.l2_capacity == 0 or m.in_l2(h):
            return
        victim = m.l2_victim()
        if victim is not None and self.write_mode == "write-back" and m.has_l3:
            self._l3_accepted(*m.spill_l3(victim))
        evicted = m.demote(blk)
        if evicted is not None:
            self.stats.l2_evictions += 1
            self._event(False, "L2", [evicted])
        self._event(True, "L2", [h], list(blk.token_ids) if self.tokens_in_events else None)

    def flush(self) -> list[bytes]:
        """After a step: write-through puts, withdrawn L3 blocks, then publish the queued
        events. Returns the hashes this flush's puts stored (not those already present)."""
        blocks, self._to_put = self._to_put, []
        live = [b for b in blocks if b.block_hash is not None]   # evicted since: nothing to write
        got = self.mover.put_l3(live) if live else ([], [])
        if got is None:   # an overlapped load holds the store's path: write at a later flush
            self._to_put = live + self._to_put
            got = ([], [])
        written, present = got
        self._l3_accepted(written, present)
        self.l3_gone(self.mover.take_l3_removed())
        events, self._events = self._events, []
        if events and self.publish is not None:
            self.publish([self._encode(e) for e in events])
        return written

    # -- L3 record -----------------------------------------------------------
    def count_in_l3(self, hashes: list[bytes]) -> int:
        """How many of ``hashes`` this worker knows to be in L3 (its record)."""
        return sum(1 for h in hashes if h in self.l3_known)

    def check_l3(self, n: int) -> int:
        """Ask the store about the ``n`` least recently checked announced blocks; withdraw
        those it lost (published at the next flush). Returns how many were gone."""
        batch = self.l3_check_batch(n)
        found = self.mover.exists_l3(batch) if batch else None
        if found is None:
            return 0
        gone = [h for h, ok in zip(batch, found) if not ok]
        self.l3_gone(gone)
        return len(gone)

    def l3_check_batch(self, n: int) -> list[bytes]:
        """The ``n`` least recently checked announced hashes (round robin)."""
        out = []
        for h in list(self.l3_known)[:n]:
            self.l3_known.move_to_end(h)
            out.append(h)
        return out

    def l3_gone(self, hashes: list[bytes]) -> None:
        """The store no longer has these (it said so, or a check or get found them
        missing): withdraw them from the record and announce their removal."""
        if hashes:
            for h in hashes:
                self.l3_known.pop(h, None)
            self.stats.l3_removed += len(hashes)
            self._event(False, "L3", hashes)

    def _l3_accepted(self, written: list[bytes], present: list[bytes]) -> None:
        # NOTE: a block the store already held (EXISTS) is announced too: it is in L3.
        hashes = written + present
        if hashes:
            self._note_in_l3(hashes)
            self._event(True, "L3", hashes)

    def _note_in_l3(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self.l3_known.pop(h, None)
            self.l3_known[h] = None
        while len(self.l3_known) > self.l3_record:
            self.l3_known.popitem(last=False)

    # -- events --------------------------------------------------------------
    def _event(self, stored: bool, tier: str, hashes: list[bytes], tokens: list[int] | None = None) -> None:
        last = self._events[-1] if self._events else None
        if (not self.tokens_in_events and isinstance(last, tuple) and last[:2] == (stored, tier)):
            last[2].extend(hashes)
        else:
            self._events.append((stored, tier, list(hashes), tokens or []))

    def _encode(self, e):
        if not isinstance(e, tuple):
            return e
        stored, tier, hashes, tokens = e
        return BlockStored(hashes, None, tokens, self.bs, tier) if stored else BlockRemoved(hashes, tier)


def credit_l3_writes(sealed: list[tuple[Sequence, int]], written: list[bytes]) -> None:
    """Count, per sequence, the blocks it sealed this step that the store took now
    (``sealed``: each scheduled sequence with its sealed-block count before the step).

    NOTE: a sequence that finished this step was freed already (its sealed count is back
    to 0), so every hash after ``before`` is matched, not only up to the sealed count."""
    if not written:
        return
    w = set(written)
    for seq, before in sealed:
        seq.l3_written_blocks += sum(1 for h in seq.block_hashes[before:] if h in w)

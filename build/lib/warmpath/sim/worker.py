"""A simulated worker: the production scheduler, block manager and block pool, with the
forward pass replaced by a :class:`~warmpath.sim.step_time.StepTime` (pure, no torch).

Its lower tiers mirror ``engine/kv_tiers.py``: L1 eviction demotes to a host-DRAM L2 (the
real ``LRUSlotIndex``), write-through / write-back to the shared L3, loads below L1 when the
real ``LoadCostModel`` says loading beats recomputing; KV events go to the router's real
``GlobalKVIndex``. Transfer time is added to the step that needs it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from warmpath.engine.sequence import Sequence
from warmpath.kv.block_pool import BlockPool, KVBlock
from warmpath.kv.events import BlockRemoved, BlockStored
from warmpath.kv.lru_index import LRUSlotIndex
from warmpath.engine.tier_rules import ExternalPrefixSource
from warmpath.kv.load_cost import LoadCostModel
from warmpath.router.index import GlobalKVIndex
from warmpath.router.state import WorkerView
from warmpath.sim.step_time import StepTime
from warmpath.sim.store import SimStore


@dataclass(frozen=True)
class SimWorkerConfig:
    num_blocks: int
    block_size: int
    block_bytes: int
    l2_blocks: int = 0
    write_policy: str = "write-through"
    scheduler: SchedulerConfig = SchedulerConfig()
    nic_bytes_s: float = 50e9
    dram_bytes_s: float = 25e9
    l3_write_bytes_s: float | None = None   # None: nic_bytes_s
    l3_write_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {self.num_blocks}")


class SimWorker(ExternalPrefixSource):
    """One engine instance (``tp`` GPUs behind one scheduler)."""

    def __init__(self, wid: str, role: str, cfg: SimWorkerConfig, step_time: StepTime,
                 store: SimStore | None, index: GlobalKVIndex) -> None:
        self.wid, self.role, self.cfg, self.st = wid, role, cfg, step_time
        self.store, self.index = store, index
        self.pool = BlockPool(cfg.num_blocks, enable_caching=True)
        self.bm = BlockManager(self.pool, cfg.block_size)
        self.sched = Scheduler(cfg.scheduler, self.bm, external=self)
        self.l2 = LRUSlotIndex(cfg.l2_blocks)
        self.cost = LoadCostModel()
        self.cost.prefill_tok_s.value = step_time.prefill_tok_s()
        self.cost.bandwidth["L2"].value = cfg.dram_bytes_s
        self.cost.bandwidth["L3"].value = cfg.nic_bytes_s
        self.busy = False          # a step (or its write-through) is in progress or about to start
        self.now = 0.0
        self._view: WorkerView | None = None
        self._plans: dict[str, tuple[int, int]] = {}
        self._load_s = 0.0
        self.last_load_s = 0.0     # of the last step's duration, KV loads from L2/L3
        self._events: list = []
        self._to_put: list[bytes] = []
        self._tok_base: dict[str, int] = {}
        self.steps = 0
        self.busy_s = 0.0
        self.pool.add_seal_hook(self._on_seal)
        self.pool.add_evict_hook(self._on_evict)

    # -- router's view -----------------------------------------------------
    def view(self) -> WorkerView:
        """Load as the router sees it (cached until the worker's state changes)."""
        if self._view is None:
            s = self.sched
            queued = sum(q.num_tokens - q.num_computed_tokens for q in s.waiting)
            queued += sum(q.num_tokens - q.num_computed_tokens for q in s.running if q.in_prefill)
            self._view = WorkerView(self.wid, self.role, queued, len(s.running), self.pool.usage,
                                    self.cost.prefill_tok_s.value, self.cfg.dram_bytes_s, self.cfg.nic_bytes_s)
        return self._view

    def add(self, seq: Sequence) -> None:
        self._view = None
        self.sched.add(seq)

    # -- stepping ------------------------------------------------------------
    def start_step(self, now: float) -> tuple[float, SchedulerOutput] | None:
        """Schedule one step at ``now``; returns its duration and plan, or ``None`` if idle."""
        self.now = now
        self._view = None
        out = self.sched.schedule()
        if out.is_empty:
            return None
        items = [(s.num_tokens, s.seq.num_computed_tokens) for s in out.scheduled]
        dt = self.st.step_s(items) + self._load_s
        self.last_load_s, self._load_s = self._load_s, 0.0
        self.steps += 1
        self.busy_s += dt
        return dt, out

    def end_step(self, now: float, out: SchedulerOutput) -> tuple[list[Sequence], list[Sequence], float]:
        """Apply the step's results at ``now``: returns (sequences that got a token, finished
        ones, seconds of write-through that delay the next step)."""
        self.now = now
        self._view = None
        sampled = {s.seq.request_id: self._token(s.seq) for s in out.scheduled if s.samples}
        got = [s.seq for s in out.scheduled if s.samples]
        finished = self.sched.update(out, sampled, ())
        put_s = self._flush(now)
        return got, finished, put_s

    def _token(self, seq: Sequence) -> int:
        """A deterministic stand-in for the sampled token (ids in the ordinary vocabulary)."""
        base = self._tok_base.get(seq.request_id)
        if base is None:
            base = self._tok_base[seq.request_id] = zlib.crc32(seq.request_id.encode())
        return 1000 + (base + 7919 * len(seq.output_token_ids)) % 39000

    def forget(self, rid: str) -> None:
        self._tok_base.pop(rid, None)

    # -- ExternalPrefixSource ------------------------------------------------
    def lookup(self, seq: Sequence, num_local_blocks: int) -> int:
        bs = self.cfg.block_size
        hashes = seq.full_block_hashes()[:(seq.num_tokens - 1) // bs][num_local_blocks:]
        n2, n3 = self.cost.plan(hashes, self.l2.count_prefix, self.store.count_prefix if self.store else None,
                                self.cfg.block_bytes, bs)
        if n2 + n3:
            self._plans[seq.request_id] = (n2, n3)
        return n2 + n3

    def schedule_load(self, seq: Sequence, first_block: int, num_blocks: int) -> None:
        n2, n3 = self._plans.pop(seq.request_id)
        hashes = seq.full_block_hashes()
        for h in hashes[first_block:first_block + n2]:
            self.l2.get(h)
        b = self.cfg.block_bytes
        self._load_s += n2 * b / self.cfg.dram_bytes_s
        if n3:
            self._load_s += self.store.link.transfer(self.now, n3 * b, self.cfg.nic_bytes_s)

    def cancel(self, seq: Sequence) -> None:
        self._plans.pop(seq.request_id, None)

    # -- tiers -----------------------------------------------------------------
    def _event(self, stored: bool, tier: str, hashes: list[bytes]) -> None:
        """Queue a KV event, merged into the previous one when it is of the same kind."""
        last = self._events[-1] if self._events else None
        if last is not None and last[0] == stored and last[1] == tier:
            last[2].extend(hashes)
        else:
            self._events.append((stored, tier, list(hashes)))

    def _on_seal(self, blk: KVBlock) -> None:
        self._event(True, "L1", [blk.block_hash])
        if self.cfg.write_policy == "write-through" and self.store is not None:
            self._to_put.append(blk.block_hash)

    def _on_evict(self, blk: KVBlock) -> None:
        h = blk.block_hash
        self._event(False, "L1", [h])
        if self.l2.capacity == 0:
            return
        got = self.l2.insert(h)
        if got is None:
            return
        self._event(True, "L2", [h])
        if got[1] is not None:
            self._event(False, "L2", [got[1]])
            if self.cfg.write_policy == "write-back" and self.store is not None:
                self._to_put.append(got[1])

    def _flush(self, now: float) -> float:
        put_s = 0.0
        if self._to_put:
            new, gone = self.store.put(self._to_put)
            if new:
                put_s = self.cfg.l3_write_latency_s + self.store.link.transfer(
                    now, len(new) * self.cfg.block_bytes, self.cfg.l3_write_bytes_s or self.cfg.nic_bytes_s)
                self._event(True, "L3", new)
            if gone:
                self._event(False, "L3", gone)
            self._to_put = []
        if self._events:
            bs = self.cfg.block_size
            self.index.apply(self.wid, [BlockStored(hs, None, [], bs, tier) if stored else BlockRemoved(hs, tier)
                                        for stored, tier, hs in self._events], now)
            self._events = []
        return put_s

"""A simulated worker: the production scheduler, block manager and block pool, with the
forward pass replaced by a :class:`~warmpath.sim.step_time.StepTime` (pure, no torch).

Its lower tiers are the production :class:`~warmpath.engine.tier_rules.TierRules` over a
:class:`~warmpath.sim.tier_mover.SimTierMover` (L2: the real ``LRUSlotIndex``; L3: the
shared ``SimStore``); KV events go to the router's real ``GlobalKVIndex``. Transfer time is
added to the step that needs it; write-through time delays the next step. As the engine does,
every step of 64 tokens or more updates the prefill speed the worker reports to the router
(``LoadCostModel.observe_prefill``): the router's estimates of a replica, which no prefill
reply refits, follow it as they follow a real worker's heartbeats.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from warmpath.engine.sequence import Sequence
from warmpath.engine.tier_rules import credit_l3_writes, TierRules, write_mode_for
from warmpath.kv.block_pool import BlockPool
from warmpath.kv.block_codec import header_size
from warmpath.kv.load_cost import LoadCostModel
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.views import WorkerView
from warmpath.sim.step_time import StepTime
from warmpath.sim.store import SimStore
from warmpath.sim.tier_mover import SimTierMover


@dataclass(frozen=True)
class SimWorkerConfig:
    num_blocks: int
    block_size: int
    block_bytes: int
    l2_blocks: int = 0
    write_mode: str = "write-through"
    scheduler: SchedulerConfig = SchedulerConfig()
    nic_bytes_s: float = 50e9
    dram_bytes_s: float = 25e9
    l3_write_bytes_s: float | None = None   # None: nic_bytes_s
    l3_write_latency_s: float = 0.0
    l3_overlap: bool = False                # L3 loads beside the steps (engine/tier_rules.py)
    multi_step: int = 1                     # steps per scheduling round (vLLM 0.6's --num-scheduler-steps)

    def __post_init__(self) -> None:
        if self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {self.num_blocks}")
        if self.multi_step < 1:
            raise ValueError(f"multi_step must be >= 1, got {self.multi_step}")

    @property
    def stored_bytes(self) -> int:
        """Bytes of one block in the store: the payload behind its header (``kv/block_codec.py``)."""
        return header_size(self.block_size) + self.block_bytes


class SimWorker:
    """One engine instance (``tp`` GPUs behind one scheduler)."""

    def __init__(self, wid: str, role: str, cfg: SimWorkerConfig, step_time: StepTime,
                 store: SimStore | None, index: GlobalKVIndex) -> None:
        self.wid, self.role, self.cfg, self.st = wid, role, cfg, step_time
        self.store, self.index = store, index
        self.pool = BlockPool(cfg.num_blocks, enable_caching=True)
        self.bm = BlockManager(self.pool, cfg.block_size)
        self.cost = LoadCostModel()
        self.cost.prefill_tok_s.value = step_time.prefill_tok_s()
        self.cost.transfer["L2"].bytes_s = cfg.dram_bytes_s
        self.cost.transfer["L3"].bytes_s = cfg.nic_bytes_s
        self.mover = SimTierMover(cfg.l2_blocks, store, cfg.block_bytes, cfg.dram_bytes_s, cfg.nic_bytes_s,
                                  l3_block_bytes=cfg.stored_bytes, overlap=cfg.l3_overlap)
        self.rules = TierRules(self.mover, self.pool, cfg.block_size, cfg.write_mode, self.cost,
                               lambda evs: index.apply(wid, evs, self.now), tokens_in_events=False)
        self.sched = Scheduler(cfg.scheduler, self.bm, external=self.rules)
        self.l2 = self.mover.l2
        self.first_scheduled: dict[str, float] = {}   # request id -> simulated time it first ran
        self.busy = False          # a step (or its write-through) is in progress or about to start
        self.now = 0.0
        self._view: WorkerView | None = None
        self.last_load_s = 0.0     # of the last step's duration, KV loads from L2/L3
        self._tok_base: dict[str, int] = {}
        self.steps = 0
        self.busy_s = 0.0
        self._step_s = 0.0
        self._aborting: set[str] = set()
        self._handed: set[str] = set()   # handed-off sequences not scheduled yet
        self.handoff_query_tokens = 0    # of the scheduler's prefix counters: handed-off prompts
        self.handoff_hit_tokens = 0      # and the KV of them loaded here (no prefix hit)
        self.trace: list[dict] | None = None   # step-trace rows (``step_trace.py``'s format) when a list
        self._step = (0.0, [])                 # the running step's start and items
        self._round = 0                        # step of the scheduling round (0: new requests may join)

    # -- router's view -----------------------------------------------------
    def view(self) -> WorkerView:
        """Load as the router sees it (cached until the worker's state changes)."""
        if self._view is None:
            s = self.sched
            queued = sum(q.num_tokens - q.num_computed_tokens for q in s.waiting)
            admitted = [*s.running, *s.loading]   # a loading sequence runs once its prefix lands
            queued += sum(q.num_tokens - q.num_computed_tokens for q in admitted if q.in_prefill)
            ctx = sum(q.num_tokens for q in admitted)   # as the router's book counts them: every one sent
            self._view = WorkerView(self.wid, self.role, queued, len(admitted), self.pool.usage,
                                    self.cost.prefill_tok_s.value, self.cfg.dram_bytes_s, self.cfg.nic_bytes_s,
                                    running_tokens=ctx, overlaps_loads=self.cfg.l3_overlap,
                                    prefilling=sum(1 for q in admitted if q.in_prefill),
                                    chunk_tokens=self.cfg.scheduler.max_num_batched_tokens)
        return self._view

    def capacity(self) -> WorkerView:
        """What it can hold, as a real worker registers it (``router/admission.fleet_limit``)."""
        return WorkerView(self.wid, self.role, max_seqs=self.cfg.scheduler.max_num_seqs,
                          kv_tokens=self.pool.num_blocks * self.cfg.block_size,
                          chunk_tokens=self.cfg.scheduler.max_num_batched_tokens)

    def set_role(self, role: str) -> None:
        """Elastic roles moved this worker: the router's view changes, and its L3 writes as
        a real worker's do (``tier_rules.write_mode_for``); what it runs goes on."""
        self.role, self._view = role, None
        self.rules.write_mode = write_mode_for(role, self.rules.write_mode)

    def decoding(self) -> int:
        """Sequences decoding here (past their prompt)."""
        return sum(1 for q in self.sched.running if not q.in_prefill)

    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; one that arrives with its first token (a P->D handoff) is counted
        apart from prefix hits once scheduled."""
        self._view = None
        if seq.output_token_ids:
            self._handed.add(seq.request_id)
        self.sched.add(seq)

    def abort(self, rid: str) -> None:
        """Stop ``rid`` and free its blocks before the next step (its client went away)."""
        self._aborting.add(rid)

    def _abort_pending(self) -> None:
        for seq in [q for q in (*self.sched.waiting, *self.sched.running, *self.sched.loading)
                    if q.request_id in self._aborting]:
            self.sched.finish(seq, "abort")
        for rid in self._aborting:
            self.forget(rid)
            self._handed.discard(rid)
        self._aborting.clear()

    # -- stepping ------------------------------------------------------------
    def start_step(self, now: float) -> tuple[float, SchedulerOutput] | None:
        """Schedule one step at ``now``; returns its duration and plan, or ``None`` if idle."""
        self.now = self.mover.now = now
        self._view = None
        if self._aborting:
            self._abort_pending()
        out = self._schedule()
        self.rules.apply_loads()
        if out.is_empty:
            return None
        for s in out.scheduled:   # the scheduler stamps wall-clock time; the simulation's clock is ``now``
            self.first_scheduled.setdefault(s.seq.request_id, now)
            if s.seq.request_id in self._handed:
                self._handed.discard(s.seq.request_id)
                self.handoff_query_tokens += s.seq.num_prompt_tokens
                self.handoff_hit_tokens += max(0, s.seq.num_cached_tokens)
        items = [(s.num_tokens, s.seq.num_computed_tokens) for s in out.scheduled]
        dt = self.st.step_s(items) + self.mover.load_s
        self.last_load_s, self.mover.load_s = self.mover.load_s, 0.0
        self.steps += 1
        self.busy_s += dt
        self._step_s = dt
        self._step = (now, items)
        return dt, out

    def _schedule(self) -> SchedulerOutput:
        """The scheduler's next step. With ``multi_step`` k > 1 new requests join only every k-th
        step while others run (vLLM 0.6's multi-step scheduling: a round of k steps is planned at
        once); what the scheduler sends back to waiting meanwhile goes ahead of them."""
        k, s = self.cfg.multi_step, self.sched
        if k == 1 or not s.running or self._round == 0:
            self._round = 1 % k
            return s.schedule()
        self._round = (self._round + 1) % k
        held, s.waiting = s.waiting, type(s.waiting)()
        try:
            return s.schedule()
        finally:
            held.extendleft(reversed(s.waiting))
            s.waiting = held

    def end_step(self, now: float, out: SchedulerOutput) -> tuple[list[Sequence], list[Sequence], float]:
        """Apply the step's results at ``now``: returns (sequences that got a token, finished
        ones, seconds of write-through that delay the next step)."""
        self.now = self.mover.now = now
        self._view = None
        sampled = {s.seq.request_id: self._token(s.seq) for s in out.scheduled if s.samples}
        got = [s.seq for s in out.scheduled if s.samples]
        sealed = [(s.seq, s.seq.num_sealed_blocks) for s in out.scheduled]
        finished = self.sched.update(out, sampled, ())
        self.cost.observe_prefill(out.num_tokens, self._step_s)   # the speed its heartbeats carry
        if self.trace is not None:   # as a real worker's --step-trace: compute apart from its KV loads
            t0, items = self._step
            self.trace.append({"t0": t0, "t1": now, "exec_s": now - t0 - self.last_load_s,
                               "tiers_s": self.last_load_s, "items": items, "model_s": self._step_s})
        put_s = self._flush(now, sealed)
        return got, finished, put_s

    def _token(self, seq: Sequence) -> int:
        """A deterministic stand-in for the sampled token (ids in the ordinary vocabulary)."""
        base = self._tok_base.get(seq.request_id)
        if base is None:
            base = self._tok_base[seq.request_id] = zlib.crc32(seq.request_id.encode())
        return 1000 + (base + 7919 * len(seq.output_token_ids)) % 39000

    def forget(self, rid: str) -> None:
        self._tok_base.pop(rid, None)
        self.first_scheduled.pop(rid, None)

    def _flush(self, now: float, sealed: list) -> float:
        """The rules' end-of-step flush; returns the seconds its L3 writes take."""
        credit_l3_writes(sealed, self.rules.flush())
        n, self.mover.put_blocks = self.mover.put_blocks, 0
        if not n:
            return 0.0
        c = self.cfg
        return c.l3_write_latency_s + self.store.link.transfer(now, n * c.stored_bytes,
                                                               c.l3_write_bytes_s or c.nic_bytes_s)

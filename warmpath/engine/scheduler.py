"""Continuous-batching scheduler with chunked prefill and preemption by recompute.

Each step gets a token budget. A sequence whose cached prefix loads beside the steps
(``ExternalPrefixSource.defers``) holds its blocks and a running slot while ``LOADING`` and
joins the running set when the load lands. With ``decode-first`` every running sequence gets
its token before any prefill is admitted, so long prompts never starve decodes;
prefills are cut into chunks that fit the remaining budget.

NOTE: no torch here; the simulator runs this class unchanged.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.sequence import Sequence, SeqStatus
from warmpath.engine.tier_seams import ExternalPrefixSource


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling limits.

    Attributes:
        max_num_seqs: running sequences at most.
        max_num_batched_tokens: tokens computed per step at most.
        enable_chunked_prefill: split prompts across steps to fit the budget.
        order: ``"decode-first"`` or ``"prefill-first"`` (which kind of work a step takes first).
        max_model_len: context window (prompt + output).
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    order: str = "decode-first"
    max_model_len: int = 8192

    def __post_init__(self) -> None:
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be > 0, got {self.max_num_seqs}")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be > 0, got {self.max_num_batched_tokens}")
        if self.order not in ("decode-first", "prefill-first"):
            raise ValueError(f"order must be 'decode-first' or 'prefill-first', got {self.order!r}")
        if self.max_model_len <= 1:
            raise ValueError(f"max_model_len must be > 1, got {self.max_model_len}")


@dataclass
class ScheduledSeq:
    """``num_tokens`` tokens of ``seq`` to compute this step."""

    seq: Sequence
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the known tokens (so we sample)."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Owns the waiting queue and running set of one engine."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 external: ExternalPrefixSource | None = None) -> None:
        self.cfg = config
        self.bm = block_manager
        self.external = external  # lower KV tiers (L2/L3) that can supply prefix blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.loading: list[Sequence] = []   # admitted, prefix loading beside the steps
        self.num_preemptions = 0
        self.preempted_by_priority: dict[int, int] = {}   # preemptions per priority of the preempted
        self.prefix_query_tokens = 0   # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0     # of which found cached

    # -- queue management ------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence: after every waiting one of its priority or a more urgent one
        (FCFS within a priority; smaller is more urgent)."""
        seq.status = SeqStatus.WAITING
        p = seq.params.priority
        if not self.waiting or self.waiting[-1].params.priority <= p:
            self.waiting.append(seq)    # the common case (one priority): O(1)
            return
        at = next(i for i, s in enumerate(self.waiting) if s.params.priority > p)
        self.waiting.insert(at, seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Stop ``seq`` (any state) and free its blocks."""
        if seq.status == SeqStatus.FINISHED:
            return
        loading = seq.status == SeqStatus.LOADING
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif loading:
            self.loading.remove(seq)
        if not loading:   # NOTE: a load still writes into its blocks: freed when it lands
            self.bm.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        p = seq.params.priority
        self.preempted_by_priority[p] = self.preempted_by_priority.get(p, 0) + 1
        # first among the waiting of its priority (it had started): before any less urgent one
        p = seq.params.priority
        at = next((i for i, s in enumerate(self.waiting) if s.params.priority >= p), len(self.waiting))
        self.waiting.insert(at, seq)

    # -- one step ----------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Pick what to compute this step."""
        out = SchedulerOutput()
        if self.external is not None:
            self._land()
        budget = [self.cfg.max_num_batched_tokens]
        if self.cfg.order == "decode-first":
            self._schedule_running(out, budget)
            self._schedule_waiting(out, budget)
        else:
            self._schedule_waiting(out, budget)
            self._schedule_running(out, budget)
        return out

    def _land(self) -> None:
        """Loads beside the steps that landed: their sequences run (finished ones free)."""
        for seq in self.external.landed():
            if seq.status == SeqStatus.FINISHED:
                self.bm.free(seq)
                continue
            self.loading.remove(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)

    def _chunk(self, remaining: int, budget: int, out: SchedulerOutput) -> int:
        if self.cfg.enable_chunked_prefill:
            return min(remaining, budget)
        # Without chunking a prompt goes whole; an over-budget one runs alone.
        if remaining <= budget or (not out.scheduled and budget == self.cfg.max_num_batched_tokens):
            return remaining
        return 0

    def _schedule_running(self, out: SchedulerOutput, budget: list[int]) -> None:
        taken = {s.seq.request_id for s in out.scheduled}
        for seq in list(self.running):
            if seq.request_id in taken or seq.status != SeqStatus.RUNNING or budget[0] <= 0:
                continue
            n = self._chunk(seq.num_tokens - seq.num_computed_tokens, budget[0], out)
            if n <= 0:
                continue
            if self._allocate_or_preempt(seq, n, taken, out):
                out.scheduled.append(ScheduledSeq(seq, n))
                taken.add(seq.request_id)
                budget[0] -= n

    def _allocate_or_preempt(self, seq: Sequence, n: int, taken: set[str],
                             out: SchedulerOutput) -> bool:
        """Room for ``n`` more tokens of ``seq``, preempting running sequences not yet in this
        step: the least urgent first, the latest admitted among equals, never one more urgent
        than ``seq`` (then ``seq`` waits for room instead)."""
        while not self.bm.allocate_slots(seq, n):
            victim = self._victim(lambda s: s.request_id not in taken and s.params.priority >= seq.params.priority)
            if victim is None:
                return False
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _victim(self, allowed) -> Sequence | None:
        """The running sequence to preempt among those ``allowed``: the least urgent, the
        latest admitted among equals (``None``: none allowed)."""
        victims = [(s.params.priority, i, s) for i, s in enumerate(self.running) if allowed(s)]
        return max(victims, key=lambda v: v[:2])[2] if victims else None

    def _room_for_waiting(self, seq: Sequence, n: int, prefix: list, out: SchedulerOutput,
                          budget: list[int]) -> bool:
        """Slots for ``n`` tokens of a waiting ``seq``; under KV pressure, running sequences
        strictly less urgent than it are preempted for it, the least urgent and latest admitted
        first (one already in this step leaves it, its tokens back in ``budget``). One priority
        (no one less urgent): no preemption, as before."""
        while not self.bm.allocate_slots(seq, n, prefix):
            victim = self._victim(lambda s: s.params.priority > seq.params.priority)
            if victim is None:
                return False
            for x in [x for x in out.scheduled if x.seq is victim]:
                out.scheduled.remove(x)
                budget[0] += x.num_tokens
            self._preempt(victim)
            out.preempted.append(victim)
        return True

    def _schedule_waiting(self, out: SchedulerOutput, budget: list[int]) -> None:
        while self.waiting and budget[0] > 0 and len(self.running) + len(self.loading) < self.cfg.max_num_seqs:
            if out.preempted:
                break  # blocks are short: admitting more would thrash
            seq = self.waiting[0]
            fresh = not seq.block_ids
            prefix = self.bm.match_prefix(seq) if fresh else []
            ext = self.external.lookup(seq, len(prefix)) if fresh and self.external else 0
            bs = self.bm.block_size
            cached = (len(prefix) + ext) * bs
            defer = bool(ext) and self.external.defers(seq)
            n = self._chunk(seq.num_tokens - seq.num_computed_tokens - cached, budget[0], out)
            if n <= 0 or not self._room_for_waiting(seq, ext * bs + (0 if defer else n), prefix, out, budget):
                if ext:
                    self.external.cancel(seq)
                break
            if ext:
                # The loaded blocks count as computed; the tiers fill them before the forward.
                seq.num_computed_tokens += ext * bs
                self.external.schedule_load(seq, len(prefix), ext)
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = cached
                seq.cached_by_tier["L1"] = len(prefix) * bs
                self.prefix_query_tokens += seq.num_prompt_tokens
                self.prefix_hit_tokens += cached
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.waiting.popleft()
            if defer:   # no compute until its prefix lands; the next waiting one may go now
                seq.status = SeqStatus.LOADING
                self.loading.append(seq)
                continue
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget[0] -= n

    def update(self, out: SchedulerOutput, sampled: dict[str, int],
               eos_ids: tuple[int, ...]) -> list[Sequence]:
        """Advance computed counts, seal full blocks, append sampled tokens.

        Returns the sequences that finished on a token rule (eos, stop token,
        max_tokens, context window); their blocks are freed.
        """
        finished = []
        now = time.monotonic()
        for s in out.scheduled:
            seq = s.seq
            if seq.status != SeqStatus.RUNNING:
                continue  # aborted while the step ran
            seq.num_computed_tokens += s.num_tokens
            self.bm.seal_full_blocks(seq)
            tok = sampled.get(seq.request_id)
            if tok is None:
                continue
            seq.output_token_ids.append(tok)
            if seq.first_token_time is None:
                seq.first_token_time = now
            reason = self.stop_reason(seq, tok, eos_ids)
            if reason:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def stop_reason(self, seq: Sequence, tok: int, eos_ids: tuple[int, ...]) -> str | None:
        """Why ``seq`` stops after sampling ``tok`` (``None``: it goes on)."""
        p = seq.params
        if (tok in eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.cfg.max_model_len:
            return "length"
        return None

"""Predicted TTFT and TPOT of one candidate path (pure, no torch, no I/O).

A path is where a request's prompt is computed and where it decodes:

* **local** — the decode worker (or a replica) computes the prompt itself, in chunks of at
  most ``chunk_tokens − batch`` tokens, each chunk in one step with the worker's running
  decodes (a *mixed* step); the prompts already queued there go first. TTFT = the router's
  hop + the prefix load (``estimate.py``) + the queued chunks' steps + its own.
* **remote** (warm or cold tier) — a prefill worker computes it (TTFT: ``estimate.py``'s
  learnt lines, handoff included) and hands it to the decode worker.

TPOT comes from the decode worker's step cost (:class:`StepCost`: a calibration's
``StepModel`` in the router — its ``decode_factor`` included —, the simulated worker's own step
time in the simulator, else :class:`LineSteps`, the learnt prefill line). A decoding request
pays, over ``R = max_tokens`` of its steps, the mixed steps of every chunk computed on its
worker meanwhile and then ``decode(b + 1)`` (a batch one larger):

    TPOT = (Σ mixed steps among the first R + max(0, R − k) · κ · decode(b + 1)) / R

with ``k`` chunks and κ the worker's online correction of its decode steps (:func:`tpot_scale`;
it does not scale the chunks: their price is the prefill's, which TTFT checks). The chunks:

* the worker's **running requests** — the prompts queued there, and this one's when local;
* **this request**, local — none: the queued prompts and its own are computed before its first
  token (its TPOT is ``κ · decode(b + 1)``);
* **this request**, remote — the queued prompts' chunks still left when its first token comes
  back from the prefill worker (:meth:`Chunks.after` its TTFT): a document prefilling on the
  decode worker stretches a warm turn handed off there; and the decode worker's load of the
  handed-off KV it does not hold (:func:`handoff_load_s`), a stall for it and its running
  decodes alike.
* **handoffs already bound for the decode worker** (their prompts computing on a prefill worker
  now) that land while this request decodes: their KV loads stall it too (:func:`incoming_load_s`),
  and each one's decode joins the batch from its landing on (:func:`decode_steps_s`): requests
  decided apart but decoding together are priced at the batch they will share.

Chunks that later requests bring are not known here; the decision bounds them (``goodput.py``).
The steps computing a prompt are priced ρ times the step cost's (:class:`ChunkScaled`), ρ the
decode worker's online correction of its local prefills while idle (``latency.RouterModel.observe_local_ttft``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from warmpath.routing.estimate import Estimate, estimate, worker_model
from warmpath.routing.latency import work
from warmpath.routing.views import PrefixHit, RequestView, Snapshot, WorkerView

UNCHUNKED = 1 << 40      # a worker that reported no prefill chunk: each prompt in one step


def chunk_of(w: WorkerView, chunk: int | None = None) -> int:
    """The prompt tokens ``w`` computes per step: ``chunk`` when given, else what it
    registered (its ``--max-num-batched-tokens``), else the whole prompt."""
    return chunk or w.chunk_tokens or UNCHUNKED


class StepCost(Protocol):
    """Seconds of one engine step over ``(new_tokens, context)`` items (a decode is
    ``(1, ctx)``): ``engine/step_model.StepModel`` and ``sim/step_time.StepTime`` are ones."""

    def step_s(self, items: list[tuple[int, int]]) -> float: ...


@dataclass(frozen=True)
class LineSteps:
    """The prior before a calibration: the router's learnt prefill line of the worker
    (``seconds = overhead + work / speed``, ``latency.py``; its peers' before it answered one,
    its heartbeat's before any), so a local prefill is priced as a remote one is, less the
    handoff. A prefill chunk costs its ``work``; the decodes one token each (their attention
    ignored), at least ``floor_tokens`` together (a step reads the weights once, however few
    sequences decode) — no floor on a prefill alone, as the line has none.

    ``decode_s`` / ``decode_per_seq_s``: the worker's learnt decode line (``latency.py``, from its
    answers' timings) when it has one: ``b`` decodes then cost ``decode_s + b·decode_per_seq_s``
    (their context ignored), and a prefill chunk beside them its work at the prefill speed."""

    overhead_s: float
    tok_s: float
    floor_tokens: int = 16
    decode_s: float | None = None
    decode_per_seq_s: float = 0.0

    def step_s(self, items: list[tuple[int, int]]) -> float:
        if not items:
            return 0.0
        dec = sum(1 for n, _ in items if n == 1)
        pre = sum(work(n, c) for n, c in items if n > 1)
        if self.decode_s is not None and dec:
            return self.decode_s + dec * self.decode_per_seq_s + pre / self.tok_s
        return self.overhead_s + (pre + (max(dec, self.floor_tokens) if dec else 0)) / self.tok_s


@dataclass(frozen=True)
class ChunkScaled:
    """``inner``'s step costs, those computing a prompt (any item of more than one token)
    ``chunk_scale`` times (ρ: the worker's measured local prefills over the predicted ones)."""

    inner: StepCost
    chunk_scale: float

    def step_s(self, items: list[tuple[int, int]]) -> float:
        s = self.inner.step_s(items)
        return s * self.chunk_scale if any(n > 1 for n, _ in items) else s


def step_cost(snap: Snapshot, w: WorkerView) -> StepCost:
    """``w``'s step cost: the router model's for it, else :class:`LineSteps` from its learnt
    lines when it reported decode steps, else the fleet's, else :class:`LineSteps` from its
    learnt prefill line; its prompt steps scaled by ρ once it has one (:class:`ChunkScaled`)."""
    steps = getattr(snap.model, "steps", {})
    m = worker_model(w, snap)
    line = m.compute
    if w.worker_id in steps:
        cost = steps[w.worker_id]
    elif m.decode is not None:
        cost = LineSteps(line.overhead_s, line.bytes_s, decode_s=m.decode.overhead_s,
                         decode_per_seq_s=1.0 / m.decode.bytes_s)
    else:
        cost = steps.get(None) or LineSteps(line.overhead_s, line.bytes_s)
    rho = getattr(snap.model, "chunk_scale", {}).get(w.worker_id)
    return ChunkScaled(cost, rho.value) if rho is not None and rho.samples and rho.value != 1.0 else cost


def tpot_scale(snap: Snapshot, w: WorkerView) -> float:
    """``w``'s online correction of its decode steps (``latency.RouterModel.observe_tpot``; 1
    before any): it scales the decode steps of the TPOT predictions, not the chunks, not TTFT."""
    k = getattr(snap.model, "tpot_scale", {}).get(w.worker_id)
    return k.value if k is not None and k.samples else 1.0


@dataclass(frozen=True)
class Chunks:
    """A prefill run as chunked mixed steps: how many, their total and the first ones."""

    steps: int = 0
    total_s: float = 0.0

    def first_s(self, r: int) -> float:
        """Seconds of the first ``r`` of these steps (they are near-equal: the mean)."""
        return self.total_s * min(r, self.steps) / self.steps if self.steps else 0.0

    def __add__(self, o: "Chunks") -> "Chunks":
        return Chunks(self.steps + o.steps, self.total_s + o.total_s)

    def after(self, t: float) -> "Chunks":
        """The steps still to run ``t`` seconds from now (the ones wholly done by then dropped)."""
        if not self.steps or t <= 0:
            return self
        done = min(self.steps, int(t * self.steps / self.total_s + 1e-9)) if self.total_s > 0 else self.steps
        return Chunks(self.steps - done, self.total_s * (self.steps - done) / self.steps)


def chunked(cost: StepCost, batch: int, decode_ctx: int, new: int, context: int, chunk: int) -> Chunks:
    """``new`` prompt tokens after ``context`` cached ones, computed ``chunk − batch`` at a
    time beside ``batch`` decodes at mean context ``decode_ctx``. The full chunks' steps are
    priced at the first and the last one's context (linear in between); the rest apart."""
    if new <= 0:
        return Chunks()
    per = max(1, chunk - batch)
    dec = [(1, decode_ctx)] * batch
    full, rest = divmod(new, per)
    total = 0.0
    if full:
        first, last = cost.step_s(dec + [(per, context)]), cost.step_s(dec + [(per, context + (full - 1) * per)])
        total += full * (first + last) / 2
    if rest:
        total += cost.step_s(dec + [(rest, context + full * per)])
    return Chunks(full + (1 if rest else 0), total)


@dataclass(frozen=True)
class PathPrediction:
    """One candidate path's predictions (seconds). ``path``: ``local`` / ``warm`` / ``cold``;
    ``running``: the decode worker's running requests whose TPOT ``running_tpot_s`` is."""

    path: str
    prefill: str | None
    decode: str
    ttft_s: float
    tpot_s: float
    running_tpot_s: float
    running: int
    cached_tokens: int
    tpot_parts: tuple[float, float] = (0.0, 0.0)   # ``tpot_s`` = chunks' share + κ · decode steps' share
    queued_s: float = 0.0          # seconds of the prompts queued on the decode worker (its chunks)
    own_s: float = 0.0             # seconds of this prompt's chunks on the decode worker (local only)
    ttft_parts: tuple[float, float] | None = None   # local on an idle worker: ``ttft_s`` = fixed + ρ · chunks
    handoff_s: float = 0.0         # remote: the KV load its handoff makes the decode worker pay
    prefilling_tpot_s: float = 0.0  # the TPOT of the worker's running requests still computing their prompt


def decode_state(dw: WorkerView, extra_tokens: int = 0) -> tuple[int, int]:
    """The decode worker's batch and mean context with one more request of
    ``extra_tokens`` (its context) in it."""
    b = dw.running + 1
    return b, (dw.running_tokens + extra_tokens) // b


def tpot_parts(stretch: Chunks, after_s: float, answer: int) -> tuple[float, float]:
    """A decoding request's TPOT over its next ``answer`` steps, ``stretch``'s mixed steps
    first, then steps of ``after_s``: (the chunks' share, the decode steps' share)."""
    r = max(1, answer)
    return stretch.first_s(r) / r, max(0, r - stretch.steps) * after_s / r


def running_tpot(stretch: Chunks, after_s: float, answer: int, k: float = 1.0) -> float:
    """:func:`tpot_parts` summed, the decode steps scaled by ``k`` (the online correction)."""
    chunks, steps = tpot_parts(stretch, after_s, answer)
    return chunks + k * steps


def decode_steps_s(cost: StepCost, batch: int, ctx: int, incoming: tuple[tuple[float, float], ...],
                   start_s: float, answer: int) -> float:
    """Mean seconds of ``answer`` decode steps starting ``start_s`` from now with ``batch``
    decodes at context ``ctx``, each handoff bound for the worker (``incoming``: seconds until
    it lands, :attr:`WorkerView.incoming`) one more decode from the step after it lands to the
    end (as the running ones, it is assumed to decode that long; its context taken as ``ctx``)."""
    r = max(1, answer)
    lands = sorted(at for at, _ in incoming)
    extra = sum(1 for at in lands if at <= start_s)
    t, left, total = start_s, r, 0.0
    for at in [*(a for a in lands if a > start_s), None]:
        step = cost.step_s([(1, ctx)] * (batch + extra))
        n = left if at is None or step <= 0 else min(left, max(0, math.ceil((at - t) / step - 1e-9)))
        total, t, left = total + n * step, t + n * step, left - n
        if not left:
            break
        extra += 1
    return total / r


def queued_chunks(cost: StepCost, dw: WorkerView, chunk: int | None = None) -> Chunks:
    """The prompts queued on ``dw`` before this one (their context unknown: none)."""
    b = dw.running
    return chunked(cost, b, dw.running_tokens // b if b else 0, dw.queued_prefill_tokens, 0, chunk_of(dw, chunk))


def predict_local(dw: WorkerView, req: RequestView, snap: Snapshot, cost: StepCost,
                  chunk: int | None = None, k: float = 1.0) -> PathPrediction:
    """``dw`` computes ``req``'s prompt in mixed steps of its chunk (:func:`chunk_of`), then
    decodes it (``k``: the TPOT correction, :func:`tpot_scale`)."""
    e = estimate(dw, req, snap, handoff=False)
    b = dw.running
    queued = queued_chunks(cost, dw, chunk)
    own = chunked(cost, b, dw.running_tokens // b if b else 0, req.num_tokens - e.cached_tokens,
                  e.cached_tokens, chunk_of(dw, chunk))
    hop = snap.model.hop_s.value if snap.model is not None else 0.0
    rho = cost.chunk_scale if isinstance(cost, ChunkScaled) else 1.0
    ttft = hop + e.load_s + queued.total_s + own.total_s
    after = decode_steps_s(cost, b + 1, decode_state(dw, req.num_tokens)[1], dw.incoming, ttft, req.max_tokens)
    r = max(1, req.max_tokens)
    bound = incoming_load_s(dw, ttft, r * k * after) / r
    return PathPrediction("local", None, dw.worker_id, ttft, bound + k * after,
                          running_tpot(queued + own, after, req.max_tokens, k), b, e.cached_tokens, (bound, after),
                          queued.total_s, own.total_s,
                          None if queued.steps or b else (hop + e.load_s, own.total_s / rho),
                          prefilling_tpot_s=running_tpot(own, after, req.max_tokens, k))


def predict_remote(pw: WorkerView, dw: WorkerView, req: RequestView, snap: Snapshot, cost: StepCost,
                   chunk: int | None = None, e: Estimate | None = None, k: float = 1.0) -> PathPrediction:
    """``pw`` computes the prompt (its tier: cold for pre-prefill, else warm) and hands it to
    ``dw`` (``e``: ``pw``'s TTFT estimate, when the caller has it already)."""
    e = e or estimate(pw, req, snap)
    b = dw.running
    ctx = decode_state(dw, req.num_tokens)[1]
    after = decode_steps_s(cost, b + 1, ctx, dw.incoming, e.ttft_s, req.max_tokens)
    stretch = queued_chunks(cost, dw, chunk)
    chunks, steps = tpot_parts(stretch.after(e.ttft_s), after, req.max_tokens)
    r = max(1, req.max_tokens)
    load = handoff_load_s(dw, req, snap)
    stall = load / r
    stall += incoming_load_s(dw, e.ttft_s, r * (chunks + stall + k * steps)) / r
    others = 0.0 if dw.overlaps_loads else load / r   # beside the steps, the running decodes go on
    later = decode_steps_s(cost, b + 1, ctx, dw.incoming, stretch.total_s, req.max_tokens)
    return PathPrediction("cold" if pw.role == "pre-prefill" else "warm", pw.worker_id, dw.worker_id, e.ttft_s,
                          chunks + stall + k * steps, running_tpot(stretch, later, req.max_tokens, k) + others, b,
                          e.cached_tokens, (chunks + stall, steps), stretch.total_s, handoff_s=load,
                          prefilling_tpot_s=k * later + others)


def handoff_load_s(dw: WorkerView, req: RequestView, snap: Snapshot) -> float:
    """Seconds ``dw`` spends loading a handed-off prompt's KV that it does not hold (its own
    L1/L2 prefix excepted; the store keeps whole blocks). The load delays this request's
    second token (its first came from the prefill worker), so it lands in its TPOT; an engine
    that loads inside its steps (``--kv-l3-overlap off``) stalls every running decode too: a
    2,048-token document handed to a pinned CPU decode worker stretched its own TPOT 36–64 ms
    for 29–33 predicted without it (``docs/benchmarks/ranking.md``). Priced at the rate
    ``dw``'s own L3 loads ran at, as its answers reported them
    (``latency.RouterModel.observe_l3_load``); before any, at its learnt L3 read line."""
    hit = snap.hits.get(dw.worker_id, PrefixHit())
    held = min(hit.local_blocks * req.block_size, req.num_tokens)
    moved = max(0, (req.num_tokens // req.block_size) * req.block_size - held) * snap.kv_bytes_per_token
    if moved <= 0:
        return 0.0
    rate = getattr(snap.model, "l3_load_rate", {}).get(dw.worker_id)
    return moved / rate.bytes_s if rate is not None and rate.samples else worker_model(dw, snap).l3_read.seconds(moved)


LANDING_SLACK = 0.1   # a landing predicted this share of the first token's time before it may come after it


def incoming_load_s(dw: WorkerView, first_s: float, answer_s: float) -> float:
    """Seconds of KV load that handoffs already bound for ``dw`` (:attr:`WorkerView.incoming`,
    prompts computing elsewhere) make it pay while a request decodes there, its first token
    ``first_s`` from now and its answer ``answer_s`` long: each landing in that window stalls
    the worker's step, this request's decode with it. Both times are predictions (TTFT's median
    error 4–9% at low load, ``docs/benchmarks/ranking.md``): a landing predicted up to
    :data:`LANDING_SLACK` of ``first_s`` before the first token counts too — two documents
    decided a moment apart, one handed off and one computed on the decode worker, land
    together and stall each other. (Their own decodes then join the batch, which the decode
    steps' batch of the moment does not see.)"""
    if dw.overlaps_loads:   # its loads run beside its steps: a landing stalls only its own request
        return 0.0
    lo = first_s * (1.0 - LANDING_SLACK)
    return sum(load for at, load in dw.incoming if lo <= at < first_s + answer_s)


def current_tpot(cost: StepCost, dw: WorkerView, answer: int, chunk: int | None = None, k: float = 1.0) -> float:
    """The decode worker's running requests' TPOT with no new request (an idle worker's: 0)."""
    return current_tpots(cost, dw, answer, chunk, k)[0]


def current_tpots(cost: StepCost, dw: WorkerView, answer: int, chunk: int | None = None,
                  k: float = 1.0) -> tuple[float, float]:
    """With no new request: the TPOT of the decode worker's running requests that decode now
    (the queued prompts' chunks first), and of those still computing their prompt there (no
    chunk queued after theirs is known: decode steps only); an idle worker's: 0, 0."""
    if dw.running == 0:
        return 0.0, 0.0
    queued = queued_chunks(cost, dw, chunk)
    after = decode_steps_s(cost, dw.running, dw.running_tokens // dw.running, dw.incoming, queued.total_s, answer)
    return running_tpot(queued, after, answer, k), k * after


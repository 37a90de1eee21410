"""The router's TTFT model, learnt online from what the workers report (pure, no I/O).

Per worker, every input of the estimate is a fitted line through observations (priors only
until the first ones):

* prefill compute: ``seconds = a + b·work`` with ``work = new·(1 + (context + new/2)/K)``
  (attention grows with the context; ``K`` tokens of context cost as much as the MLPs),
  from each prefill reply (its own seconds less queue and L3 time);
* L3 read and write: ``seconds = overhead + bytes / bandwidth``, from the reply's L3
  seconds and the tokens it loaded from L3 / the bytes it wrote;
* the router's hop: round trip less the worker's own time (moving average);
* the L3 loads a worker's answers report (``usage["warmpath"]``: tokens loaded from L3 and
  the seconds they took): the rate of its own loads (a decode worker's handed-off KV);
* decode steps: ``seconds = overhead + batch · per-sequence`` from the answers' own timings
  (:class:`~warmpath.protocol.internal.AnswerTiming` in ``usage["warmpath"]["timing"]``: the
  seconds between the first and the last token over the steps between, in the batch the
  worker saw); one batch size so far: its mean step, flat in the batch.

An answer's timings also feed the prefill line when the worker computed the prompt itself
(a replica, a PPD-local turn): its first token's seconds less its queue, for the tokens it
did not find cached (``observe_answer``). vLLM workers report them (``vllm/relay.py``).

``Prediction`` records what the plan expected so the router can compare with the TTFT it
then measured (``warmpath_router_ttft_error_ratio``; goal: median ≤ 15% at low load).

Step costs (``steps``: worker id → a ``router/predict.StepCost``, ``None`` → the fleet's,
from a calibration or the simulator) price decode and mixed steps for the TPOT predictions;
each decode worker's correction κ of its decode steps (``tpot_scale``) follows the answers
online (``warmpath_router_tpot_error_ratio``: the error before the correction): from each
answer, the κ that would have predicted its TPOT exactly — its measured TPOT less the chunks'
share of the prediction, over the decode steps' share — and κ is the median of the last
``TPOT_WINDOW`` of them, so the few answers stretched by prompts that came after their
decision (which no prediction saw) do not move it as a mean would. Likewise ρ
(``chunk_scale``) corrects the price of a decode worker's prompt steps from the TTFT of the
prompts it computed while idle — nothing queued, no decode step to wait for
(``observe_local_ttft``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from warmpath.kv.load_cost import Ema, RateFit, TransferFit
from warmpath.stats import percentile

TPOT_WINDOW = 16
RHO_MIN_SAMPLES = 3
RHO_MIN_SHARE = 0.9

SHRINK_N = 8             # observations at which a worker's own prefill line weighs as much as its peers'
ATTN_TOKENS = 8192        # K: context tokens whose attention costs as much as a token's MLPs


def work(new: int, context: int) -> float:
    """Prefill work of ``new`` tokens after ``context`` cached ones, in token units."""
    return new * (1.0 + (context + new / 2) / ATTN_TOKENS)


@dataclass
class WorkerModel:
    """What the router has learnt about one worker (lines fitted to its replies)."""

    compute: TransferFit                    # seconds vs work units (``bytes_s``: work units/s)
    l3_read: TransferFit                    # seconds vs bytes
    l3_write: TransferFit
    observations: int = 0
    decode: TransferFit | None = None       # step seconds vs batch (``bytes_s``: sequences/s), once observed

    @classmethod
    def prior(cls, w) -> "WorkerModel":
        """Before any reply: the speeds the worker measured and heartbeats."""
        return cls(TransferFit(0.0, w.prefill_tok_s), TransferFit(2e-3, w.l3_bytes_s), TransferFit(2e-3, w.l3_bytes_s))

    def compute_s(self, new: int, context: int) -> float:
        return self.compute.seconds(work(new, context)) if new > 0 else 0.0

    def queue_s(self, queued_tokens: int) -> float:
        """Seconds to clear ``queued_tokens`` of prompt work (context unknown: none)."""
        return queued_tokens / self.compute.bytes_s if queued_tokens > 0 else 0.0

    def params(self) -> dict:
        c, r, wr = self.compute, self.l3_read, self.l3_write
        out = {"prefill_tok_s": round(c.bytes_s, 1), "prefill_overhead_s": round(c.overhead_s, 4),
               "l3_read_bytes_s": round(r.bytes_s), "l3_write_bytes_s": round(wr.bytes_s),
               "observations": self.observations}
        if self.decode is not None:
            out |= {"decode_step_s": round(self.decode.overhead_s, 5),
                    "decode_s_per_seq": round(1.0 / self.decode.bytes_s, 6), "decode_samples": self.decode.samples}
        return out

    def observe_step(self, batch: float, seconds: float) -> None:
        """One decode step's seconds in a batch of ``batch`` sequences (a mean over an answer's)."""
        line = self.decode = self.decode or TransferFit(0.0, math.inf)
        line.update(batch, seconds)
        if not line.fitted:             # one batch size so far: its mean step, flat in the batch
            line.overhead_s = line.sums[2] / line.sums[0]


@dataclass(frozen=True)
class PrefillObservation:
    """One prefill as its worker measured it (``/internal/prefill``'s reply) and the router's
    round trip to it."""

    worker: str
    prompt_tokens: int
    cached_tokens: int
    l3_tokens: int                 # of the cached ones, loaded from L3
    queue_s: float
    worker_s: float                # the worker's own time, arrival to first token
    l3_get_s: float
    l3_put_s: float
    l3_put_bytes: int
    round_trip_s: float


def _mean_line(lines: list[TransferFit]) -> TransferFit:
    """The mean overhead and the mean seconds per unit of ``lines`` (a pooled prior)."""
    n = len(lines)
    return TransferFit(sum(x.overhead_s for x in lines) / n, n / sum(1.0 / x.bytes_s for x in lines))


@dataclass
class WindowMedian:
    """The median of the last ``window`` samples once there are ``min_samples``; ``value``
    before (no change: 1)."""

    value: float = 1.0
    window: int = TPOT_WINDOW
    min_samples: int = 1
    xs: list[float] = field(default_factory=list)
    samples: int = 0

    def update(self, x: float) -> None:
        self.xs.append(x)
        del self.xs[:-self.window]
        self.samples += 1
        s = sorted(self.xs)
        n = len(s)
        if n >= self.min_samples:
            self.value = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass
class RouterModel:
    """Per-worker lines plus the router's own hop; ``kv_bytes_per_token`` from registration."""

    kv_bytes_per_token: int = 46080
    workers: dict[str, WorkerModel] = field(default_factory=dict)
    hop_s: Ema = field(default_factory=lambda: Ema(0.005, alpha=0.1))
    errors: list[float] = field(default_factory=list)     # |predicted - actual| / actual, recent
    max_errors: int = 512
    steps: dict = field(default_factory=dict)              # worker id (None: any) -> StepCost
    tpot_scale: dict[str, "WindowMedian"] = field(default_factory=dict)   # decode worker -> κ of its decode steps
    chunk_scale: dict[str, "WindowMedian"] = field(default_factory=dict)  # decode worker -> ρ of its prompt steps
    tpot_errors: list[float] = field(default_factory=list)
    l3_load_rate: dict[str, RateFit] = field(default_factory=dict)   # worker -> its own L3 loads, as its answers report

    def of(self, w) -> WorkerModel:
        """The worker's model; before it answered a prefill, its peers' (the same model on
        the same kind of machine), else its heartbeat speeds. While it has few observations
        its prefill line is shrunk towards its peers' pooled line (own weight n / (n +
        ``SHRINK_N``), whole from 4·``SHRINK_N`` on): a line through two noisy points must not
        price a worker out of the traffic that would correct it."""
        m = self.workers.get(w.worker_id)
        if m is not None and m.observations >= 4 * SHRINK_N:
            return m
        peers = [p for k, p in self.workers.items() if k != w.worker_id and p.observations > 0]
        if not peers:
            return m if m is not None else WorkerModel.prior(w)
        pooled = _mean_line([p.compute for p in peers])
        if m is None:
            return WorkerModel(pooled, _mean_line([p.l3_read for p in peers]), _mean_line([p.l3_write for p in peers]))
        k = m.observations / (m.observations + SHRINK_N)
        per_unit = k / m.compute.bytes_s + (1 - k) / pooled.bytes_s
        blended = TransferFit(k * m.compute.overhead_s + (1 - k) * pooled.overhead_s, 1.0 / per_unit)
        return WorkerModel(blended, m.l3_read, m.l3_write, m.observations, m.decode)

    def forget(self, worker: str) -> None:
        self.workers.pop(worker, None)

    def observe_prefill(self, o: PrefillObservation, view) -> None:
        m = self.workers.get(o.worker)
        if m is None:
            m = self.workers[o.worker] = WorkerModel.prior(view)
        m.observations += 1
        compute = o.worker_s - o.queue_s - o.l3_get_s - o.l3_put_s
        new = o.prompt_tokens - o.cached_tokens
        if compute > 0 and new > 0:
            x = work(new, o.cached_tokens)
            m.compute.update(x, compute)
            if not m.compute.fitted:    # one size so far: its speed, with the prior's overhead
                m.compute.bytes_s = x / max(1e-9, compute - m.compute.overhead_s)
        if o.l3_tokens > 0 and o.l3_get_s > 0:
            m.l3_read.update(o.l3_tokens * self.kv_bytes_per_token, o.l3_get_s)
        if o.l3_put_bytes > 0 and o.l3_put_s > 0:
            m.l3_write.update(o.l3_put_bytes, o.l3_put_s)
        if o.round_trip_s >= o.worker_s:
            self.hop_s.update(o.round_trip_s - o.worker_s)

    def observe_answer(self, worker: str, t, view, computed_here: bool) -> None:
        """An answer's own timings (``t``: :class:`~warmpath.protocol.internal.AnswerTiming`)
        from ``worker``: its decode line, and its prefill line when ``computed_here`` (it
        computed the prompt: no handoff). The hop is not touched (no round trip to a first token)."""
        if computed_here and t.computed_tokens > 0 and t.prefill_s > 0:
            self.observe_prefill(PrefillObservation(worker, t.computed_tokens + t.cached_tokens, t.cached_tokens, 0,
                                                    t.queue_s, t.prefill_s, 0.0, 0.0, 0, 0.0), view)
        if t.decode_steps > 0 and t.decode_s > 0:
            m = self.workers.get(worker)
            if m is None:
                m = self.workers[worker] = WorkerModel.prior(view)
            m.observe_step(t.batch, t.decode_s / t.decode_steps)

    def observe_l3_load(self, worker: str, tokens: int, seconds: float) -> bool:
        """``worker`` loaded ``tokens`` of a prompt's KV from L3 in ``seconds``, as its answer
        reports (``usage["warmpath"]``): the rate of its own loads — for a decode worker the
        handed-off KV, under whatever load it had — which prices the stall a handoff brings it
        (``predict.handoff_load_s``). Returns whether it learnt (nothing loaded, or no seconds: no)."""
        if tokens <= 0 or seconds <= 0:
            return False
        self.l3_load_rate.setdefault(worker, RateFit()).update(tokens * self.kv_bytes_per_token, seconds)
        return True

    def observe_ttft(self, predicted_s: float, actual_s: float) -> float | None:
        """Record a request's predicted vs measured TTFT; returns the relative error."""
        if actual_s <= 0 or predicted_s <= 0:
            return None
        err = abs(predicted_s - actual_s) / actual_s
        self.errors.append(err)
        del self.errors[:-self.max_errors]
        return err

    def observe_tpot(self, worker: str, predicted_s: float, actual_s: float,
                     parts: tuple[float, float] | None = None) -> float | None:
        """A request's predicted vs measured TPOT on ``worker``: the relative error; the
        worker's κ takes the value that would have predicted it, within [0.25, 4]
        (``parts``: the prediction's chunks' share and decode steps' share before κ,
        ``PathPrediction.tpot_parts``; ``None``: all of it decode steps, at the current κ)."""
        if actual_s <= 0 or predicted_s <= 0:
            return None
        k = self.tpot_scale.setdefault(worker, WindowMedian())
        chunks, steps = parts if parts is not None and parts[1] > 0 else (0.0, predicted_s / k.value)
        k.update(min(4.0, max(0.25, (actual_s - chunks) / steps)))
        err = abs(predicted_s - actual_s) / actual_s
        self.tpot_errors.append(err)
        del self.tpot_errors[:-self.max_errors]
        return err

    def observe_local_ttft(self, worker: str, fixed_s: float, chunks_s: float, actual_s: float) -> None:
        """A prompt ``worker`` computed itself while idle (nothing queued, nothing running):
        predicted TTFT = ``fixed_s`` (hop, prefix load) + ρ · ``chunks_s`` (its steps before ρ);
        ρ takes the value that would have predicted ``actual_s``, within [0.25, 4]; it applies
        from the third (the median of three outlives one outlier: a cold engine's first prompt
        is one). Only prompts whose steps are ``RHO_MIN_SHARE`` of the predicted TTFT or more
        teach it: in a short one a per-request overhead no line prices would pass for slow
        steps; beside running decodes, the wait for the step in flight would."""
        if chunks_s > 0 and actual_s > 0 and chunks_s >= RHO_MIN_SHARE * (fixed_s + chunks_s):
            self.chunk_scale.setdefault(worker, WindowMedian(min_samples=RHO_MIN_SAMPLES)).update(
                min(4.0, max(0.25, (actual_s - fixed_s) / chunks_s)))

    def params(self) -> dict:
        """What the router believes now (``/v1/cluster``)."""
        return {"hop_s": round(self.hop_s.value, 4), "kv_bytes_per_token": self.kv_bytes_per_token,
                "ttft_error_p50": percentile(self.errors, 50), "ttft_error_n": len(self.errors),
                "tpot_error_p50": percentile(self.tpot_errors, 50), "tpot_error_n": len(self.tpot_errors),
                "tpot_scale": {w: round(k.value, 3) for w, k in self.tpot_scale.items()},
                "chunk_scale": {w: round(k.value, 3) for w, k in self.chunk_scale.items()},
                "workers": {w: m.params() for w, m in self.workers.items()}}


@dataclass
class ArrivalRates:
    """Requests per second arriving per class (``cold``, ``warm``) over the last
    ``window_s``, counting one more than seen (so an unseen class is never taken to be
    certainly absent: a spill that would block it is charged for at least one arrival per
    window). Pure; the caller passes the time."""

    window_s: float = 30.0
    times: dict[str, list[float]] = field(default_factory=lambda: {"cold": [], "warm": []})

    def note(self, cls: str, now: float) -> None:
        self.times.setdefault(cls, []).append(now)

    def rates(self, now: float) -> dict[str, float]:
        out = {}
        for cls, ts in self.times.items():
            cut = 0
            while cut < len(ts) and ts[cut] < now - self.window_s:
                cut += 1
            del ts[:cut]
            out[cls] = (len(ts) + 1) / self.window_s
        return out


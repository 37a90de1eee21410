"""PPD: for turn 2+, run the append-prefill on the decode worker holding the session, or not.

``x=0``: always through a prefill worker; ``x=1``: always local; ``dynamic``: score
S = w_ttft·ΔTTFT − w_tpot·ΔTPOT, where ΔTTFT is the relative TTFT saved by going local and
ΔTPOT the relative TPOT slowdown it causes. Local when S > 0. The two paths' TTFT/TPOT come
from, in order: what was observed on both paths in the request's bucket
(:class:`PPDFeedback`, once each has ``min_samples``); else the table measured offline by
``warmpath calibrate``; else the router's online model (the TTFT estimates of both paths,
queues included). Observed and tabled TTFTs are queue-free — an observation is stored less
the queue wait its path was predicted to have when it was decided
(:attr:`PPDDecision.queue_s`) — and each path's live queue is added when deciding: an
observed remote TTFT taken while a prefill worker was busy with a long first turn must not
send later turns local once that worker is idle. While one path of a bucket lacks samples, every
``explore_every``-th decision there takes it, so the feedback can correct a wrong start.

The TPOT term, when the router's online model predicts it (:class:`Harm`, ``routing/predict.py``),
counts every request the choice slows, not only this one: with decodes running, ΔTPOT =
``running`` × the relative slowdown of each running decode's TPOT (clipped at 0: the simulated
PPD grid went local on predicted handoff-stall savings at 24 sessions/s on 3P1D and lost 33% of
TPOT); with none, this request's own relative change. A local
append-prefill is one (or a few) mixed steps that every running decode on the worker waits
through; no observed TPOT shows that cost (both paths decode on the same worker, so per path
they differ by ~0), and on this CPU it is what raised x=1's TPOT 10–12% over x=0's at one
running decode or two (docs/benchmarks/policies.md). With nothing running, local costs nobody.

NOTE: pure; no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.kv.load_cost import Ema
from warmpath.routing.views import RequestView, WorkerView

CTX_EDGES = (512, 4096)             # ≤512 / 512–4096 / >4096
RATIO_EDGES = (0.25, 1.0, 4.0)      # new input tokens / output tokens
LOAD_EDGES = (4, 16)                # running sequences on the decode worker


def _bucket(x: float, edges: tuple) -> int:
    return sum(1 for e in edges if x > e)


def bucket_of(context: int, new_tokens: int, max_tokens: int, running: int) -> tuple[int, int, int]:
    return (_bucket(context, CTX_EDGES), _bucket(new_tokens / max(1, max_tokens), RATIO_EDGES),
            _bucket(running, LOAD_EDGES))


MODES = ("off", "x0", "x1", "dynamic")      # --ppd: off, or how turn 2+ may run on its decode worker

@dataclass(frozen=True)
class Cell:
    """Measured in one bucket: TTFT and TPOT with the append-prefill local vs remote (s)."""

    ttft_local: float
    ttft_remote: float
    tpot_local: float
    tpot_remote: float


def _rel(x: float, base: float) -> float:
    """``x``'s relative change from ``base`` (0 without a base)."""
    return (x - base) / base if base > 0 else 0.0


@dataclass(frozen=True)
class Harm:
    """Predicted TPOTs (s) for the score's TPOT term: this request's own on each path and the
    decode worker's ``running`` requests' on each (``routing/predict.py``'s ``tpot_s`` /
    ``running_tpot_s``)."""

    running: int
    own_local: float
    own_remote: float
    mates_local: float
    mates_remote: float

    def d_tpot(self) -> float:
        """Relative TPOT change of going local: with decodes running, ``running`` × each one's
        slowdown (never a credit: a predicted saving to them does not argue for local); with
        none, this request's own change."""
        if self.running == 0:
            return _rel(self.own_local, self.own_remote)
        return self.running * max(0.0, _rel(self.mates_local, self.mates_remote))


@dataclass
class PPDTable:
    cells: dict[tuple[int, int, int], Cell] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {",".join(map(str, k)): vars(v) for k, v in self.cells.items()}

    @classmethod
    def from_json(cls, d: dict) -> "PPDTable":
        return cls({tuple(int(x) for x in k.split(",")): Cell(**v) for k, v in d.items()})


@dataclass(frozen=True)
class PPDConfig:
    mode: str = "dynamic"            # one of MODES but "off" (a router with PPD off has no PPDConfig)
    w_ttft: float = 1.0
    w_tpot: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in MODES[1:]:
            raise ValueError(f"PPD mode must be x0, x1 or dynamic, got {self.mode!r}")


@dataclass
class PPDDecision:
    local: bool
    score: float
    reason: str
    bucket: tuple[int, int, int] | None = None
    queue_s: float = 0.0             # the chosen path's predicted queue wait (taken off its observed TTFT)


@dataclass
class PathStats:
    """Observed outcomes of one path in one bucket (moving averages)."""

    ttft: Ema = field(default_factory=lambda: Ema(0.0))
    tpot: Ema = field(default_factory=lambda: Ema(0.0))


@dataclass
class PPDFeedback:
    """TTFT / TPOT observed per bucket and path (``local`` / ``remote``); TTFTs without the
    queue wait (the caller takes off the decision's ``queue_s``)."""

    min_samples: int = 3
    explore_every: int = 8
    paths: dict[tuple, PathStats] = field(default_factory=dict)
    seen: dict[tuple, int] = field(default_factory=dict)      # decisions per bucket

    def observe(self, bucket: tuple, path: str, ttft_s: float | None = None, tpot_s: float | None = None) -> None:
        st = self.paths.setdefault((bucket, path), PathStats())
        if ttft_s is not None:
            st.ttft.update(ttft_s)
        if tpot_s is not None:
            st.tpot.update(tpot_s)

    def ready(self, bucket: tuple, path: str) -> bool:
        st = self.paths.get((bucket, path))
        return st is not None and st.ttft.samples >= self.min_samples

    def cell(self, bucket: tuple) -> Cell | None:
        """Both paths' observed means, once both have enough samples."""
        if not (self.ready(bucket, "local") and self.ready(bucket, "remote")):
            return None
        lo, re = self.paths[(bucket, "local")], self.paths[(bucket, "remote")]
        return Cell(lo.ttft.value, re.ttft.value, lo.tpot.value, re.tpot.value)

    def explore(self, bucket: tuple) -> str | None:
        """The path to try now to learn it (every ``explore_every``-th decision), if any."""
        n = self.seen[bucket] = self.seen.get(bucket, 0) + 1
        for path in ("local", "remote"):
            if not self.ready(bucket, path) and n % self.explore_every == 1:
                return path
        return None


def decide(cfg: PPDConfig, table: PPDTable, req: RequestView, decode: WorkerView, remote_queue_s: float,
           feedback: PPDFeedback | None = None, model_cell: Cell | None = None,
           harm: Harm | None = None) -> PPDDecision:
    """Whether turn ``req.turn`` (≥ 2) runs its append-prefill on ``decode``
    (``model_cell``: the online model's estimate of both paths, queues included; ``harm``:
    its TPOT predictions, which then set the TPOT term whatever source sets the TTFTs)."""
    if req.turn < 2:
        return PPDDecision(False, 0.0, "turn 1 always goes through prefill")
    if cfg.mode == "x0":
        return PPDDecision(False, 0.0, "x=0")
    if cfg.mode == "x1":
        return PPDDecision(True, 0.0, "x=1")
    new = req.new_tokens if req.new_tokens is not None else req.num_tokens
    key = bucket_of(req.num_tokens, new, req.max_tokens, decode.running)
    local_q = decode.queued_prefill_tokens / decode.prefill_tok_s
    d = _decide_dynamic(cfg, table, key, new, decode, local_q, remote_queue_s, feedback, model_cell, harm)
    d.queue_s = local_q if d.local else remote_queue_s
    return d


def _decide_dynamic(cfg: PPDConfig, table: PPDTable, key: tuple, new: int, decode: WorkerView, local_q: float,
                    remote_q: float, feedback: PPDFeedback | None, model_cell: Cell | None,
                    harm: Harm | None) -> PPDDecision:
    """``decide``'s dynamic mode: explore, else observed, else table (both queue-free, plus
    the live queues), else the model."""
    if feedback is not None:
        if (path := feedback.explore(key)) is not None:
            return PPDDecision(path == "local", 0.0, f"explore {path} (bucket {key})", key)
        if (cell := feedback.cell(key)) is not None:
            return _score(cfg, cell.ttft_local + local_q, cell.ttft_remote + remote_q, cell, key, "observed", harm)
    if (cell := table.cells.get(key)) is not None:
        return _score(cfg, cell.ttft_local + local_q, cell.ttft_remote + remote_q, cell, key, "table", harm)
    if model_cell is None:   # neither: a first-principles cell from the worker's speeds
        t_new = new / decode.prefill_tok_s
        model_cell = Cell(t_new + local_q, t_new + 0.05 + remote_q, 0.0, 0.0)
    return _score(cfg, model_cell.ttft_local, model_cell.ttft_remote, model_cell, key, "model", harm)


def _score(cfg: PPDConfig, ttft_local: float, ttft_remote: float, cell: Cell, key: tuple, src: str,
           harm: Harm | None = None) -> PPDDecision:
    """S = w_ttft·ΔTTFT − w_tpot·ΔTPOT; ΔTPOT from ``harm`` when given, else ``cell``'s TPOTs."""
    d_ttft = -_rel(ttft_local, ttft_remote)
    if harm is not None:
        d_tpot, why = harm.d_tpot(), f", {harm.running} running"
    else:
        d_tpot, why = _rel(cell.tpot_local, cell.tpot_remote), ""
    s = cfg.w_ttft * d_ttft - cfg.w_tpot * d_tpot
    return PPDDecision(s > 0, s, f"S={s:.3f} (dTTFT {d_ttft:+.2f}, dTPOT {d_tpot:+.2f}{why}, {src}, bucket {key})",
                       key)


# Representative values of each bucket used to fill a table from a step model.
CTX_REP = {0: 256, 1: 2048, 2: 6144}
RATIO_REP = {0: 0.125, 1: 0.5, 2: 2.0, 3: 8.0}
LOAD_REP = {0: 2, 1: 8, 2: 32}


def table_from_model(model, kv_bytes_per_token: int, l3_bytes_s: float, network_bytes_s: float,
                     out_tokens: int = 128) -> PPDTable:
    """Fill every bucket from a fitted :class:`~warmpath.engine.step_model.StepModel`.

    Local: the append-prefill of ``n`` new tokens runs in one step with the decode batch.
    Remote: a prefill worker loads the ``c``-token history from L3, computes ``n`` tokens and
    hands ``c + n`` tokens of KV to the decode worker. TPOT local: that one slower step spread
    over the answer's ``out_tokens``; remote: the plain decode step.
    """
    cells = {}
    for ci, c in CTX_REP.items():
        for ri, r in RATIO_REP.items():
            n = max(1, int(r * out_tokens))
            for li, b in LOAD_REP.items():
                local = model.mixed_s(b, c, n)
                remote = (model.prefill_s(n, c) + c * kv_bytes_per_token / l3_bytes_s
                          + (c + n) * kv_bytes_per_token / network_bytes_s)
                tpot = model.decode_s(b, c)
                cells[(ci, ri, li)] = Cell(local, remote, tpot + (local - tpot) / out_tokens, tpot)
    return PPDTable(cells)

"""The ``goodput`` policy's path decision: every candidate path, the requests it keeps
within their targets, the best one (pure, no torch, no I/O).

Candidates (``routing/predict.py`` predicts each one's TTFT and TPOT):

* **local** on each decode worker (and replica): it computes the prompt in its batch —
  any turn, turn 1 included, no handoff;
* **remote** on each prefill-type worker (its tier: warm for ``prefill``, cold for
  ``pre-prefill``) with each decode-type worker to hand off to — a decode worker or a
  replica (a replica decodes a handed-off prompt as a decode worker does: a layout of
  cold-tier workers beside replicas computes documents apart and decodes them aggregated).

A path's score is the number of requests predicted within their targets: this one (TTFT
and TPOT within its class's bounds), and every decode worker's running requests (their
TPOT within the running bound; the path's decode worker at the TPOT the path leaves it,
the others at their current — those still computing their own prompt there stretched only by
the chunks queued after theirs, this request's when local: ``PathPrediction.prefilling_tpot_s``).
Requests queued for a prompt are not delayed by one that
queues behind them. The most kept wins; a tie goes to the lowest predicted TTFT plus the
harm the path does to later requests (in units of this request's TTFT bound, so a request
with slack (a cold one, 20 s) pays ten times what a warm one (2 s) pays for the same harm:
it lends its slack): at a prefill tier the TTFT it adds to the tier's later arrivals (CPD's
``estimate.harm_s``, over their TTFT bound); locally the decode time its chunks add to the
later arrivals on that decode worker (:func:`local_harm_s`, over their TPOT bound times the
answer); then the fewest running on the decode worker, then the ids. A request at risk
borrows: it takes the path that keeps it within its bound even when that stretches others,
as long as they stay within theirs — and never a local path that would push the decode
worker's running requests past their TPOT bound, from within it, while another path keeps
this request's TTFT within its bound (``Scored.over``: the chunks that stretch them are this
request's own; with no such path, a warm turn is not sent behind a document to spare the
running decodes a few slow steps — in the simulated ranking52 pair, seed 12, one waited 8 s at
the prefill worker so). Running requests
already past it are at risk, not lost: a request's TPOT is its whole answer's, and a decode
worker over the bound now recovers as its requests finish unless more are sent there — so a
path to it loses them as a path that pushes a worker past the bound does (counting them lost
on every path made the worker over its bound the cheapest place for every next request: in the
simulated B200 map, 2P1D / 20% cold / 16K at 0.4 sessions/s and 2× the unloaded TPOT, one
decoder took the warm requests at 25–26 ms per token for a 15 ms bound, attainment 0.66 → 0.85
with this rule). A local path's harm to later arrivals still counts.

**Slack.** A prediction cannot see the chunks that later requests bring: a decision that
packs each decode worker up to the TPOT bound leaves its requests there to be pushed past it
by the next arrivals. Each decode-type worker's TPOT is therefore planned within
``slack_share`` of the slack between its unloaded TPOT (a batch-1 decode step at the
request's context, or at its running requests' mean context) and the bound
(:func:`planned`): in the simulated B200 map (cold tier + TP4 replicas, seed 0), share 1
sustained less under a TPOT bound of 2× the unloaded TPOT than under the tighter 1.3× in 3
of 8 cells and missed the best fixed arm in 6 of 8 at 2×; share 0.5 met or beat it in all
8 (``docs/benchmarks/policies_sim.md``, "A cold tier beside replicas").

**Hold.** When the best path's batch would push this request, or the running requests within
their bound now, past their TPOT bound, while this request alone on that worker would be
within — and its decode would start while those running now still decode (a local path, or a
first token due within a lone answer's time) — it waits at the router (:func:`hold_s`) and is
decided again: its TTFT slack lent to the decodes running (TaiChi's latency shifting), never
beyond ``hold_share`` of its TTFT bound.
On a 1P1D pair where one decode worker keeps two decodes within the bound, three warm turns
decided within 0.3 s were all lost when sent at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.routing.classify import ColdRule
from warmpath.slo import Target
from warmpath.routing.estimate import estimate, harm_s, tier_class
from warmpath.routing.predict import (DEFAULT_CHUNK, PathPrediction, current_tpots, predict_local,
                                     predict_remote, step_cost, tpot_scale)
from warmpath.routing.views import RequestView, Snapshot


SLACK_SHARE = 0.5     # of each request's TPOT slack a decision plans to use (module docstring, "Slack")
HOLD_SHARE = 0.75     # of its TTFT bound a request may spend held plus its predicted TTFT ("Hold")
HOLD_STEP_S = 0.1     # a held request is decided again after this long


@dataclass(frozen=True)
class GoodputConfig:
    """``target``: the service target (:class:`warmpath.slo.Target`; ``None``: no bounds, so the lowest TTFT + harm wins);
    ``chunk_tokens``: the engines' tokens per step (chunked prefill); ``local``: consider
    local paths at all; ``slack_share``: plan TPOT within that share of the slack between
    the unloaded TPOT and the bound (:func:`planned`); the cold rule as CPD's."""

    target: Target | None = None
    chunk_tokens: int = DEFAULT_CHUNK
    local: bool = True
    slack_share: float = SLACK_SHARE
    harm_weight: float = 1.0
    hold_share: float = HOLD_SHARE
    hold_step_s: float = HOLD_STEP_S
    cold_threshold: float = 0.5
    min_cached_tokens: int = 256

    def __post_init__(self) -> None:
        ColdRule(self.cold_threshold, self.min_cached_tokens)   # validates both
        if self.chunk_tokens < 2:
            raise ValueError(f"chunk_tokens must be >= 2, got {self.chunk_tokens}")
        if not 0 < self.slack_share <= 1:
            raise ValueError(f"slack_share must be in (0, 1], got {self.slack_share}")
        if not 0 <= self.hold_share <= 1:
            raise ValueError(f"hold_share must be in [0, 1], got {self.hold_share}")
        if self.hold_step_s < 0:
            raise ValueError(f"hold_step_s must be >= 0, got {self.hold_step_s}")
        if self.harm_weight < 0:
            raise ValueError(f"harm_weight must be >= 0, got {self.harm_weight}")
        if self.target is not None and not isinstance(self.target, Target):
            raise ValueError(f"target must be a warmpath.slo.Target, got {type(self.target).__name__}")

    def bound(self, classes: list[str], metric: str) -> float | None:
        """The per-request bound on ``metric`` for a request of ``classes`` (``None``: none)."""
        return None if self.target is None else self.target.request_bound(classes, metric)

    def running_tpot_bound(self) -> float | None:
        """The bound the running requests' TPOT is held to (their classes unknown here: the
        tightest of the cold, warm and overall ones)."""
        got = [b for c in (["cold"], ["warm"], []) if (b := self.bound(c, "tpot")) is not None]
        return min(got) if got else None


@dataclass(frozen=True)
class Scored:
    """A candidate path, the requests it keeps within their targets and its tie-break cost."""

    pred: PathPrediction
    kept: int
    cost_s: float
    harm_s: float
    over: bool = False     # local, and its chunks push the running requests (within now) past their TPOT bound
    waitable: bool = False  # its decode worker's batch pushes this request, or the running ones (within
    #                         now), past their TPOT bound, and this one alone there would be within (its TTFT too)
    ttft_ok: bool = True    # its predicted TTFT within this request's bound


def planned(bound: float | None, lone_s: float, share: float) -> float | None:
    """The TPOT bound a decision plans for: the unloaded TPOT ``lone_s`` (a batch-1 decode
    step) plus ``share`` of the slack up to ``bound`` (the bound itself at share 1, or when
    no slack is left)."""
    if bound is None or share >= 1 or bound <= lone_s:
        return bound
    return lone_s + share * (bound - lone_s)


def request_classes(cls: str, turn: int) -> list[str]:
    """The target classes of a request (``bench/metrics.Record.classes`` less ``all``)."""
    return [cls, "turn1" if turn == 1 else "turn2+"]


def paths(req: RequestView, snap: Snapshot, cfg: GoodputConfig, allow_local: bool = True) -> list[PathPrediction]:
    """Every candidate path's predictions (``cfg.local`` off: local paths only where no
    prefill-type worker can take the prompt)."""
    decoders = snap.by_role("decode", "replica")
    out = []
    if cfg.local and allow_local:
        out += [predict_local(w, req, snap, step_cost(snap, w), cfg.chunk_tokens, tpot_scale(snap, w))
                for w in decoders]
    costs = {d.worker_id: (step_cost(snap, d), tpot_scale(snap, d)) for d in decoders}
    for p in snap.by_role("pre-prefill", "prefill"):
        e = estimate(p, req, snap)
        out += [predict_remote(p, d, req, snap, costs[d.worker_id][0], cfg.chunk_tokens, e, costs[d.worker_id][1])
                for d in decoders]
    if not out and not cfg.local and allow_local:   # local off, but no prefill-type worker to hand off from
        out = [predict_local(w, req, snap, costs[w.worker_id][0], cfg.chunk_tokens, costs[w.worker_id][1])
               for w in decoders]
    return out


def local_harm_s(p: PathPrediction, snap: Snapshot, tpot_bound: float | None, answer: int,
                 lone_s: float = 0.0) -> float:
    """The decode time a local path's chunks (``s``, after ``q`` queued) add to the requests
    arriving on its decode worker meanwhile (λ: every class's arrivals per decode-type worker;
    those arriving while ``q`` drains pay all of ``s``, those during ``s`` half): λ·s·(q + s/2),
    over their TPOT bound times ``answer`` tokens (a second spread over the answer, in bounds).
    0 without a TPOT bound, or when no decode there could meet it: a lone decode step there
    (``lone_s``) above the bound."""
    if tpot_bound is None or p.path != "local" or lone_s > tpot_bound:
        return 0.0
    lam = sum(snap.arrivals_s.values()) / max(1, len(snap.by_role("decode", "replica")))
    return lam * p.own_s * (p.queued_s + p.own_s / 2) / (tpot_bound * max(1, answer))


def score(req: RequestView, snap: Snapshot, cfg: GoodputConfig, cls: str,
          preds: list[PathPrediction]) -> list[Scored]:
    """Each path's requests kept within their targets and its tie-break cost."""
    classes = request_classes(cls, req.turn)
    ttft_b, tpot_b, run_b = cfg.bound(classes, "ttft"), cfg.bound(classes, "tpot"), cfg.running_tpot_bound()
    holders = {w.worker_id: w for w in snap.by_role("decode", "replica")}
    base = {wid: w.running for wid, w in holders.items()}   # past the bound now: at risk, not lost
    lone, me_b, run_bw, now_within = {}, {}, {}, {}
    for wid, w in holders.items():   # planned within a share of each one's slack over its unloaded TPOT
        cost = step_cost(snap, w)
        lone[wid] = cost.step_s([(1, req.num_tokens)])
        me_b[wid] = planned(tpot_b, lone[wid], cfg.slack_share)
        ctx = w.running_tokens // w.running if w.running else req.num_tokens
        run_bw[wid] = planned(run_b, cost.step_s([(1, ctx)]), cfg.slack_share)
        now = current_tpots(cost, w, req.max_tokens, cfg.chunk_tokens, tpot_scale(snap, w))
        now_within[wid] = tuple(run_bw[wid] is None or t <= run_bw[wid] for t in now)   # decoding, prefilling
    total = sum(base.values())
    harm = {}
    mine = cfg.bound([cls], "ttft") or 1.0              # harm in units of this request's TTFT bound
    for pw in snap.by_role("pre-prefill", "prefill"):
        theirs = cfg.bound([tier_class(pw)], "ttft") or 1.0
        harm[pw.worker_id] = cfg.harm_weight * harm_s(pw, estimate(pw, req, snap), snap) * mine / theirs
    out = []
    for p in preds:
        ttft_ok = ttft_b is None or p.ttft_s <= ttft_b
        tpot_ok = me_b[p.decode] is None or p.tpot_s <= me_b[p.decode]
        me = ttft_ok and tpot_ok
        rb, w = run_bw[p.decode], holders[p.decode]
        pre = min(w.prefilling, w.running)       # its running requests still computing their prompt there
        within = (rb is None or p.running_tpot_s <= rb, rb is None or p.prefilling_tpot_s <= rb)
        alone = lone[p.decode] if p.path == "local" else 0.0
        h = harm.get(p.prefill, 0.0) + cfg.harm_weight * local_harm_s(p, snap, run_b, req.max_tokens, alone) * mine
        pushes = any(n and now and not ok for n, now, ok in zip((w.running - pre, pre), now_within[p.decode], within))
        # holding helps only where this request's decode starts while those running now still
        # decode: locally (its chunks start now), or handed off with its first token due within a
        # lone answer's time (later, those running now have ended, held or not)
        soon = p.path == "local" or p.ttft_s <= lone[p.decode] * max(1, req.max_tokens)
        could = me_b[p.decode] is not None and lone[p.decode] < me_b[p.decode] and ttft_ok and soon
        here = (w.running - pre) * within[0] + pre * within[1]
        out.append(Scored(p, int(me) + total - base.get(p.decode, 0) + here, p.ttft_s + h, h,
                          p.path == "local" and pushes, could and (pushes or not tpot_ok), ttft_ok))
    return out


def hold_s(got: Scored, req: RequestView, cfg: GoodputConfig, cls: str) -> float:
    """How long to hold ``req`` before deciding again (0: go now with ``got``, the best path).
    A request is held when the best path's batch pushes it, or the running requests within their
    bound now, past their TPOT bound while it alone there would be within (``Scored.waitable``),
    while its TTFT has slack: the time held so far (``RequestView.waited_s``), the next hold
    and the path's predicted TTFT within ``hold_share`` of its TTFT bound (none: never held).
    It lends its TTFT slack to the decodes running (TaiChi's latency shifting): three warm
    turns decided within 0.3 s on one decode worker that keeps two within the TPOT bound lose
    all three sent at once, and none when the third waits for the first answer to end."""
    bound = cfg.bound(request_classes(cls, req.turn), "ttft")
    if not cfg.hold_step_s or not got.waitable or bound is None:
        return 0.0
    left = cfg.hold_share * bound - req.waited_s - got.pred.ttft_s
    return cfg.hold_step_s if left >= cfg.hold_step_s else 0.0


def choose(scored: list[Scored], session_decode: str | None = None) -> Scored:
    """Of the paths not ``over`` (all, when every one is, or when none of those left keeps this
    request's TTFT within its bound: a warm turn is not sent behind a document to spare the
    running decodes a few slow steps): the most requests kept; then the lowest TTFT + harm; then
    the session's decode worker, the fewest running there, the ids."""
    if not scored:
        raise LookupError("no candidate path (no decode worker, or none with a prefill worker)")
    spare = any(not s.over and s.ttft_ok for s in scored)
    return min(scored, key=lambda s: (s.over and spare, -s.kept, round(s.cost_s, 9), s.pred.decode != session_decode,
                                      s.pred.running, s.pred.prefill or "", s.pred.decode))

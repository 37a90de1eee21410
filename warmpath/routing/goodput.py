"""The ``goodput`` policy's path decision: every candidate path, the requests it keeps within
their targets, the best one (pure, no torch, no I/O).

**Candidates** (``routing/predict.py`` predicts each one's TTFT and TPOT): *local* on each
decode worker or replica (it computes the prompt in its batch, any turn, no handoff), and
*remote* on each prefill-type worker (warm for ``prefill``, cold for ``pre-prefill``) with
each decode-type worker to hand off to (a replica decodes a handed-off prompt as a decode
worker does).

**Score**: the number of requests predicted within their targets — this one (TTFT and TPOT
within its class's bounds) and every decode worker's running requests (their TPOT within the
running bound, at the TPOT the path leaves them). The most kept wins; a tie goes to the lowest
predicted TTFT plus the harm the path does to later requests, in units of this request's TTFT
bound (a request with slack lends it): at a prefill tier the TTFT it adds to the tier's later
arrivals (``estimate.harm_s``), locally the decode time its chunks add on that decode worker
(:func:`local_harm_s`); then the fewest running, then the ids.

**At risk**: a request may take the path that keeps it within its bound even when that
stretches others, as long as they stay within theirs, but never a local path that pushes the
decode worker's running requests past their bound while another path keeps this request's
TTFT (``Scored.over``). Running requests already past the bound count as lost on any path
that sends more work there, so a worker over its bound is not the cheapest next place.

**Slack**: a prediction cannot see the chunks later requests bring, so each decode-type
worker's TPOT is planned within ``slack_share`` of the slack between its unloaded TPOT and
the bound (:func:`planned`); the measured effect of the share is in
``docs/benchmarks/policies_sim.md``.

**Hold**: when the best path's batch would push this request, or those running within their
bound, past the TPOT bound while this request alone would be within — and its decode would
start while those running still decode (a local path, or a first token due within a lone
answer's time) — it waits at the router (:func:`hold_s`) and is decided again, its TTFT slack
lent to the running decodes (TaiChi's latency shifting), never beyond ``hold_share`` of its
TTFT bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.routing.classify import ColdRule
from warmpath.slo import Target
from warmpath.routing.estimate import estimate, harm_s, tier_class
from warmpath.routing.predict import (PathPrediction, current_tpots, predict_local,
                                     predict_remote, step_cost, tpot_scale)
from warmpath.routing.views import RequestView, Snapshot


SLACK_SHARE = 0.5     # of each request's TPOT slack a decision plans to use (module docstring, "Slack")
HOLD_SHARE = 0.75     # of its TTFT bound a request may spend held plus its predicted TTFT ("Hold")
HOLD_STEP_S = 0.1     # a held request is decided again after this long


@dataclass(frozen=True)
class GoodputConfig:
    """``target``: the service target (:class:`warmpath.slo.Target`; ``None``: no bounds, so
    the lowest TTFT + harm wins; prompts are chunked as each worker registered); ``local``: consider
    local paths at all; ``slack_share``: plan TPOT within that share of the slack between
    the unloaded TPOT and the bound (:func:`planned`); the cold rule as CPD's."""

    target: Target | None = None
    local: bool = True
    slack_share: float = SLACK_SHARE
    harm_weight: float = 1.0
    hold_share: float = HOLD_SHARE
    hold_step_s: float = HOLD_STEP_S
    cold_threshold: float = 0.5
    min_cached_tokens: int = 256

    def __post_init__(self) -> None:
        ColdRule(self.cold_threshold, self.min_cached_tokens)   # validates both
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
        out += [predict_local(w, req, snap, step_cost(snap, w), k=tpot_scale(snap, w))
                for w in decoders]
    costs = {d.worker_id: (step_cost(snap, d), tpot_scale(snap, d)) for d in decoders}
    for p in snap.by_role("pre-prefill", "prefill"):
        e = estimate(p, req, snap)
        out += [predict_remote(p, d, req, snap, costs[d.worker_id][0], e=e, k=costs[d.worker_id][1])
                for d in decoders]
    if not out and not cfg.local and allow_local:   # local off, but no prefill-type worker to hand off from
        out = [predict_local(w, req, snap, costs[w.worker_id][0], k=costs[w.worker_id][1])
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
        now = current_tpots(cost, w, req.max_tokens, k=tpot_scale(snap, w))
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

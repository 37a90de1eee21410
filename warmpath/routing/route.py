"""One request's route decision, shared by the router and the simulator (pure, no I/O).

The steps every request takes before it runs, in one place:

1. :meth:`RouteDecider.request_view` — the request as policies see it (turn, new tokens of the
   session's history);
2. :meth:`RouteDecider.snapshot` — workers with their load, and the prefix each one holds
   (looked up only where a prompt may be computed: prefill-type workers, replicas, and
   the session's own decode worker for a PPD-local turn; every decode worker for a policy
   that picks local paths itself, ``goodput``, or when no prefill-type worker is healthy);
3. :meth:`RouteDecider.decide_route` — the routing policy (with no healthy prefill-type worker,
   the prompt runs on a decode worker instead of being refused), then the PPD switch for turn 2+ (the
   append-prefill runs on the session's decode worker, or not; not for ``goodput``, whose
   paths include local ones for every turn), and the request's class
   (cold / warm, :mod:`warmpath.routing.classify`);
4. what happened next feeds back: :meth:`RouteDecider.observe_prefill` (the online TTFT model,
   ``latency.py``), :meth:`RouteDecider.observe_outcome` (predicted vs measured TTFT and TPOT, the PPD
   feedback), and :meth:`RouteDecider.rebalance` (elastic roles, ``elastic.py``: the load it
   reads — predicted queues and running TPOT, the recent share of requests routed local).

``router/flow.py`` and ``sim/simulation.py`` both call it; neither decides anything itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from pydantic import ValidationError

from warmpath.protocol.internal import AnswerTiming, StageLoads
from warmpath.routing import ppd
from warmpath.routing.classify import ColdRule, reuse
from warmpath.routing.elastic import (
    Elastic,
    ElasticConfig,
    Load,
    RoleChange,
    slots_used,
    with_policy_units,
)
from warmpath.routing.estimate import estimate
from warmpath.routing.latency import ArrivalRates, PrefillObservation, RouterModel
from warmpath.routing.policy import NoPrefillWorker, RoutingPolicy
from warmpath.routing.predict import (
    current_tpot,
    predict_local,
    predict_remote,
    step_cost,
    tpot_scale,
)
from warmpath.routing.sessions import SessionState
from warmpath.routing.views import Decision, PrefixHit, RequestView, Snapshot, WorkerView

Lookup = Callable[[str], PrefixHit]      # worker id -> its cached prefix of the request
_NO_ELASTIC = ElasticConfig(enabled=False)


class RouteDecider:
    """Each request's route: the routing policy, the PPD switch and the cold rule, applied the
    same way everywhere."""

    def __init__(self, policy: RoutingPolicy, ppd_cfg: ppd.PPDConfig | None = None,
                 ppd_table: ppd.PPDTable | None = None, network_bytes_s: float = 1e9,
                 elastic: ElasticConfig = _NO_ELASTIC) -> None:
        self.policy, self.ppd_cfg = policy, ppd_cfg
        self.ppd_table = ppd_table or ppd.PPDTable()
        self.network_bytes_s = network_bytes_s
        self.model = RouterModel()
        self.rates = ArrivalRates()
        self.feedback = ppd.PPDFeedback()
        self.elastic = Elastic(with_policy_units(elastic, policy))
        self.recent_local: deque[bool] = deque(maxlen=64)   # the last decisions: prompt and decode on one worker?
        self.recent_answers: deque[int] = deque(maxlen=64)  # the last requests' answer budgets (max_tokens)

    @property
    def cold_rule(self) -> ColdRule:
        return self.policy.cold_rule

    @staticmethod
    def request_view(num_tokens: int, block_hashes: Sequence[bytes], block_size: int,
                     session_id: str | None, session: SessionState | None, max_tokens: int,
                     ns_hashes: dict | None = None, tenant: str = "default", priority: int = 0) -> RequestView:
        """Turn ``n`` of a session (1 without one); ``new_tokens``: what the session's
        history (its last prompt + answer) does not already hold; ``max_tokens``: the answer's
        budget (the client's, else what the workers give a request without one:
        :func:`answer_budget`); ``ns_hashes``: its hashes in the fleet's other namespaces;
        ``tenant`` and ``priority``: whom it is for and how urgent (``routing/tenants.py``)."""
        held = session.context_tokens if session else 0
        return RequestView(num_tokens, block_hashes, block_size, session_id,
                           turn=(session.turns + 1) if session else 1,
                           new_tokens=num_tokens - held if 0 < held < num_tokens else num_tokens,
                           max_tokens=max_tokens, ns_hashes=ns_hashes or {}, tenant=tenant, priority=priority)

    def snapshot(self, views: list[WorkerView], lookup: Lookup, session_decode: str | None,
                 kv_bytes_per_token: int, now: float = 0.0) -> Snapshot:
        """What the policies see: ``views`` (with load), the prefix hits where they matter,
        the learnt model and the recent arrival rates per class."""
        every = self.policy.decides_local or not any(v.role in ("prefill", "pre-prefill") for v in views)
        hits = {v.worker_id: lookup(v.worker_id) for v in views
                if v.role != "decode" or v.worker_id == session_decode or every}
        self.model.kv_bytes_per_token = kv_bytes_per_token
        return Snapshot(views, hits, session_decode, kv_bytes_per_token, self.network_bytes_s,
                        self.model, self.rates.rates(now), now)

    def decide_route(self, rv: RequestView, snap: Snapshot, allow_local: bool = True,
                     arrival: bool = True) -> Decision:
        """Where ``rv`` runs (``LookupError`` when no worker can take it). ``Decision.ppd``
        says which way the PPD switch went, for a turn 2+ it applied to. ``arrival``: a new
        request (counted in the arrival rates and the share routed local), not a second
        decision for one."""
        d = self._decide(rv, snap, allow_local, arrival)
        if arrival:
            self.recent_local.append(d.prefill in (None, d.decode))
            self.recent_answers.append(rv.max_tokens)
        return d

    def _decide(self, rv: RequestView, snap: Snapshot, allow_local: bool, arrival: bool) -> Decision:
        local_paths = self.policy.decides_local
        try:
            d = self.policy.route(rv, snap, allow_local) if local_paths else self.policy.route(rv, snap)
        except NoPrefillWorker:
            if not allow_local:
                raise
            d = self._on_decode(rv, snap)
        cls = d.cls or (d.path if d.path in ("cold", "warm") else self.cold_rule.label(reuse(rv, snap), rv.num_tokens))
        if d.cls != cls:            # NOTE: a policy that set it already (cpd) skips the copy (~6 us)
            d = replace(d, cls=cls)
        if arrival:
            self.rates.note(cls, snap.now)
        if (local_paths or self.ppd_cfg is None or rv.turn < 2 or d.prefill in (None, d.decode)
                or snap.session_decode_worker is None or d.decode != snap.session_decode_worker):
            return d
        views = {w.worker_id: w for w in snap.workers}
        dw, pw = views[d.decode], views[d.prefill]
        remote, local = estimate(pw, rv, snap), estimate(dw, rv, snap, handoff=False)
        cost = step_cost(snap, dw)   # both paths' TPOTs, this request's and the running decodes' (routing/predict.py)
        k = tpot_scale(snap, dw)
        pl, pr = predict_local(dw, rv, snap, cost, k=k), predict_remote(pw, dw, rv, snap, cost, e=remote, k=k)
        harm = ppd.Harm(dw.running, pl.tpot_s, pr.tpot_s, pl.running_tpot_s, pr.running_tpot_s)
        choice = ppd.decide(self.ppd_cfg, self.ppd_table, rv, dw, remote.queue_s, self.feedback,
                            ppd.Cell(local.ttft_s, remote.ttft_s, 0.0, 0.0), harm)   # TPOTs: ``harm``'s
        if not (choice.local and allow_local):
            return replace(d, ppd="remote", bucket=choice.bucket, reason=f"{d.reason}; PPD remote: {choice.reason}",
                           ppd_reason=choice.reason, ppd_queue_s=choice.queue_s)
        return Decision(None, dw.worker_id, "local", local.ttft_s, local.cached_tokens, choice.reason,
                        ppd="local", cls=cls, bucket=choice.bucket, ppd_reason=choice.reason,
                        ppd_queue_s=choice.queue_s)

    def _on_decode(self, rv: RequestView, snap: Snapshot) -> Decision:
        """No prefill-type worker is healthy (all dropped, draining or not yet registered):
        the prompt is computed on a decode worker — the session's when alive — as an
        aggregated replica would, rather than refused (Dynamo's decode workers do the same
        when no prefill worker is registered). Raises the original ``NoPrefillWorker``
        when no decode worker is healthy either."""
        try:
            dw = self.policy.decode_for(snap)
        except LookupError:
            raise NoPrefillWorker() from None
        e = estimate(dw, rv, snap, handoff=False)
        return Decision(None, dw.worker_id, "local", e.ttft_s, e.cached_tokens,
                        f"no healthy prefill worker: the prompt runs on {dw.worker_id}")

    def observe_prefill(self, obs: PrefillObservation, view: WorkerView | None) -> None:
        """A prefill reply: refit that worker's lines."""
        if view is not None:
            self.model.observe_prefill(obs, view)

    def observe_answer(self, worker: str, usage: dict | None, view: WorkerView | None, computed_here: bool) -> bool:
        """An answer's usage: when it carries the worker's own timings
        (``usage["warmpath"]["timing"]``, :class:`~warmpath.protocol.internal.AnswerTiming`),
        refit that worker's decode line, and its prefill line when ``computed_here``. Returns
        whether it learnt (malformed timings are ignored: a worker's report, not the client's).
        Its own part (``["decode"]`` or ``["worker"]``, :class:`StageLoads`) also tells the rate
        of its L3 loads (:meth:`RouterModel.observe_l3_load`)."""
        ext = (usage or {}).get("warmpath") if isinstance(usage, dict) else None
        if view is None or not isinstance(ext, dict):
            return False
        learnt = False
        own = ext.get("decode", ext.get("worker"))
        if isinstance(own, dict):
            try:
                st = StageLoads.model_validate(own)
                learnt = self.model.observe_l3_load(worker, st.loaded_tokens.get("L3", 0), st.l3_load_s)
            except ValidationError:
                pass
        try:
            t = AnswerTiming.model_validate(ext["timing"]) if isinstance(ext.get("timing"), dict) else None
        except ValidationError:
            t = None
        if t is not None:
            self.model.observe_answer(worker, t, view, computed_here)
        return learnt or t is not None

    def observe_outcome(self, d: Decision, ttft_s: float | None,
                        tpot_s: float | None) -> tuple[float | None, float | None]:
        """A request's measured TTFT (from its admission) and TPOT: the model's errors (the
        TPOT one also corrects the decode worker's step cost online), and the PPD feedback of
        the path it took. Returns the relative TTFT and TPOT errors (``None``: not predicted
        or not measured). The PPD feedback keeps TTFTs without the queue wait predicted at the
        decision (``ppd.decide`` adds the live one back)."""
        if d.bucket is not None and d.ppd is not None:
            served = None if ttft_s is None else max(0.0, ttft_s - d.ppd_queue_s)
            self.feedback.observe(d.bucket, d.ppd, served, tpot_s)
        ttft_err = self.model.observe_ttft(d.est_ttft_s, ttft_s) if ttft_s is not None else None
        if ttft_s is not None and d.est_ttft_parts is not None and d.decode is not None:
            self.model.observe_local_ttft(d.decode, *d.est_ttft_parts, ttft_s)
        tpot_err = (self.model.observe_tpot(d.decode, d.est_tpot_s, tpot_s, d.est_tpot_parts)
                    if tpot_s is not None and d.est_tpot_s is not None and d.decode is not None else None)
        return ttft_err, tpot_err

    def rebalance(self, views: list[WorkerView], now: float,
                  decoding: Callable[[WorkerView], int] | None = None, waiting: int = 0,
                  slots: dict[str, int] | None = None) -> RoleChange | None:
        """Elastic roles: a role change to apply now, if the load calls for one. ``views``
        with the load the policies see; ``decoding(view)``: requests decoding there (default
        the view's ``running``); ``waiting``: requests waiting at admission, ``slots``: each
        worker's admission slots (``admission.FleetLimit.slots``). The running requests' TPOT
        is priced over the recent requests' mean answer budget."""
        snap = Snapshot(views, {}, None, self.model.kv_bytes_per_token, self.network_bytes_s, self.model, {}, now)
        answer = sum(self.recent_answers) // len(self.recent_answers) if self.recent_answers else 1
        tpot = ((lambda w: current_tpot(step_cost(snap, w), w, answer, k=tpot_scale(snap, w)))
                if self.elastic.cfg.tpot_s else (lambda w: 0.0))
        local = sum(self.recent_local) / len(self.recent_local) if self.recent_local else 0.0
        decoding = decoding or (lambda w: w.running)
        load = Load(lambda w: self.model.of(w).queue_s(w.queued_prefill_tokens), tpot, decoding, local,
                    slots_used(decoding, views, waiting, slots or {}))
        return self.elastic.step(views, load, now)

    def decode_for(self, snap: Snapshot) -> str:
        """A decode worker to go on with a request whose first token exists (its KV is in
        L3): the session's when alive, else the least loaded."""
        return self.policy.decode_for(snap).worker_id


def answer_budget(asked: int | None, views: Sequence[WorkerView], prompt_tokens: int,
                  max_model_len: int | None) -> int:
    """The answer budget a request gets: ``asked`` (the client's ``max_tokens``), else the
    largest default the workers registered (``WorkerView.default_max_tokens``), capped at the
    context left as a worker caps it (at least 1); with no default registered, the context left.
    Raises ``LookupError`` when neither is known."""
    if asked:
        return asked
    defaults = [v.default_max_tokens for v in views if v.default_max_tokens]
    if not defaults and not max_model_len:
        raise LookupError("no registered worker reported its default max_tokens or its context length")
    room = max_model_len - prompt_tokens if max_model_len else max(defaults)
    return max(1, min(max(defaults, default=room), room))

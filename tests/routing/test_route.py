"""The one request plan (routing/route.py) that the router and the simulator both run."""

from dataclasses import replace

import pytest

from warmpath.routing.classify import ColdRule, reuse
from warmpath.routing.route import RouteDecider, answer_budget
from warmpath.routing.policy import CPDPolicy, PDKVPolicy, PDPolicy
from warmpath.routing.ppd import PPDConfig
from warmpath.routing.sessions import SessionState
from warmpath.routing.views import PrefixHit, RequestView, WorkerView

HASHES = tuple(bytes([i]) * 16 for i in range(100))


def w(wid, role, q=0, running=0):
    return WorkerView(wid, role, queued_prefill_tokens=q, running=running, prefill_tok_s=500.0)


WORKERS = [w("c1", "pre-prefill"), w("p1", "prefill", q=100), w("p2", "prefill"),
           w("d1", "decode", running=2), w("d2", "decode", running=1)]


def snapshot(decider, hits, session_decode=None, workers=WORKERS):
    return decider.snapshot(workers, lambda wid: hits.get(wid, PrefixHit()), session_decode, 1000)


def test_request_view_turn_and_new_tokens():
    sess = SessionState(decode_worker="d1", turns=2, context_tokens=1000)
    rv = RouteDecider.request_view(1200, HASHES[:75], 16, "s", sess, 64)
    assert (rv.turn, rv.new_tokens, rv.max_tokens, rv.session_id) == (3, 200, 64, "s")
    assert (RouteDecider.request_view(1200, (), 16, None, None, 64).turn,
            RouteDecider.request_view(1200, (), 16, None, None, 64).new_tokens) == (1, 1200)
    # a history longer than the prompt (the client cut it): everything is new
    assert RouteDecider.request_view(900, (), 16, "s", sess, 64).new_tokens == 900


def test_snapshot_looks_up_prefixes_only_where_a_prompt_is_computed():
    asked = []
    snap = RouteDecider(CPDPolicy()).snapshot(WORKERS, lambda wid: asked.append(wid) or PrefixHit(1, 0), "d2", 1000)
    assert asked == ["c1", "p1", "p2", "d2"] and set(snap.hits) == {"c1", "p1", "p2", "d2"}
    assert snap.session_decode_worker == "d2" and snap.kv_bytes_per_token == 1000


def test_the_class_is_the_requests_reuse_not_the_chosen_workers():
    decider, rv = RouteDecider(PDPolicy()), RequestView(1600, HASHES, 16, max_tokens=128)
    # PD is cache-blind: it takes the least queued worker (c1 or p2, no prefix), yet 90 of
    # the 100 blocks are cached on p1, so the request is warm
    d = decider.decide_route(rv, snapshot(decider, {"p1": PrefixHit(90, 0)}))
    assert (d.prefill, d.cached_tokens, d.cls) == ("c1", 0, "warm")
    assert decider.decide_route(rv, snapshot(decider, {})).cls == "cold"
    # 40 of 100 blocks (640 of 1600 tokens) is below half: cold
    assert decider.decide_route(rv, snapshot(decider, {"p1": PrefixHit(40, 0)})).cls == "cold"


def test_cold_rule_by_hand():
    r = ColdRule(0.5, 256)
    assert r.label(800, 1600) == "warm" and r.label(799, 1600) == "cold"
    assert r.label(200, 201) == "cold"       # 99% reused, but under 256 tokens
    with pytest.raises(ValueError):
        ColdRule(1.5)
    decider = RouteDecider(PDPolicy())
    snap = snapshot(decider, {"p1": PrefixHit(90, 0), "c1": PrefixHit(10, 5)})
    assert reuse(RequestView(1600, HASHES, 16, max_tokens=128), snap) == 1440


def test_cpd_class_is_its_tier():
    decider, rv = RouteDecider(CPDPolicy()), RequestView(1600, HASHES, 16, max_tokens=128)
    d = decider.decide_route(rv, snapshot(decider, {"p2": PrefixHit(90, 0)}))
    assert (d.path, d.cls, d.prefill) == ("warm", "warm", "p2")
    d = decider.decide_route(rv, snapshot(decider, {}))
    assert (d.path, d.cls, d.prefill) == ("cold", "cold", "c1")


def test_ppd_switch_local_remote_and_retry():
    rv = RequestView(1600, HASHES, 16, "s", turn=2, new_tokens=100, max_tokens=64)
    hits = {"d1": PrefixHit(93, 0), "p2": PrefixHit(93, 0)}
    local = RouteDecider(CPDPolicy(), PPDConfig("x1"))
    d = local.decide_route(rv, snapshot(local, hits, "d1"))
    assert (d.prefill, d.decode, d.path, d.ppd, d.cached_tokens, d.cls) == (None, "d1", "local", "local", 1488, "warm")
    d = local.decide_route(rv, snapshot(local, hits, "d1"), allow_local=False)   # a retry never goes local
    assert (d.prefill, d.decode, d.ppd) == ("p2", "d1", "remote")
    never = RouteDecider(CPDPolicy(), PPDConfig("x0"))
    assert never.decide_route(rv, snapshot(never, hits, "d1")).ppd == "remote"
    # turn 1, or no PPD, or the session's decode worker gone: the switch does not apply
    assert local.decide_route(RequestView(1600, HASHES, 16, max_tokens=128), snapshot(local, hits, "d1")).ppd is None
    assert RouteDecider(CPDPolicy()).decide_route(rv, snapshot(local, hits, "d1")).ppd is None
    assert local.decide_route(rv, snapshot(local, hits, "d9")).ppd is None


def test_decode_for_keeps_the_session_else_least_loaded():
    decider = RouteDecider(CPDPolicy())
    assert decider.decode_for(snapshot(decider, {}, "d1")) == "d1"
    assert decider.decode_for(snapshot(decider, {}, None)) == "d2"


def test_with_no_prefill_worker_the_prompt_runs_on_a_decode_worker():
    """Every prefill-type worker dropped or draining: the request is computed on a decode
    worker (the session's, else the least loaded) with the prefix it holds, not refused; a
    retry (``allow_local=False``) and a fleet without decode workers still get the error."""
    decode_only = [w("d1", "decode", running=2), w("d2", "decode", running=1)]
    rv = RequestView(1600, HASHES, 16, "s", turn=2, new_tokens=100, max_tokens=64)
    hits = {"d1": PrefixHit(60, 0), "d2": PrefixHit(5, 0)}
    for policy in (CPDPolicy(), PDPolicy(), PDKVPolicy()):
        decider = RouteDecider(policy, PPDConfig("x0"))
        asked = []
        snap = decider.snapshot(decode_only, lambda wid: asked.append(wid) or hits[wid], "d1", 1000)
        assert asked == ["d1", "d2"]                 # with no prefill worker, every decode worker is looked up
        d = decider.decide_route(rv, snap)
        # 60 of 100 blocks on the session's d1: 960 cached tokens, 0.6 reused -> warm; PPD x0 does not apply
        assert (d.prefill, d.decode, d.path, d.cached_tokens, d.cls, d.ppd) == \
            (None, "d1", "local", 960, "warm", None)
        assert "no healthy prefill worker" in d.reason
        # no session: the least loaded decode worker (1 running), with its own 5 blocks; the
        # class is the request's reuse in the fleet (d1's 60 blocks), not the chosen worker's
        d = decider.decide_route(RequestView(1600, HASHES, 16, max_tokens=128), snapshot(decider, hits, None, decode_only))
        assert (d.prefill, d.decode, d.cached_tokens, d.cls) == (None, "d2", 80, "warm")
        with pytest.raises(LookupError, match="no healthy prefill worker"):
            decider.decide_route(rv, snap, allow_local=False)
        with pytest.raises(LookupError, match="no healthy prefill worker"):
            decider.decide_route(rv, snapshot(decider, {}, None, []))


def test_dynamic_ppd_charges_a_local_prefill_to_each_running_decode():
    """The switch's TPOT term comes from the step model's predictions on both paths: the
    same turn on the same decode worker scores lower with two running decodes than with none
    (each waits through the local chunk), and the score travels in the response headers."""
    from warmpath.engine.step_model import StepModel
    from warmpath.routing.views import predicted_headers

    sm = StepModel((0.005, 0.0001, 0.0), (0.010, 0.001, 0.0), mixed_coef=(0.010, 0.0001, 0.0, 0.001, 0.0),
                   mixed_rows=10)
    rv = RequestView(1600, HASHES, 16, "s", turn=2, new_tokens=100, max_tokens=64)
    hits = {"d1": PrefixHit(93, 0), "p2": PrefixHit(93, 0)}
    scores = {}
    for running in (0, 2):
        decider = RouteDecider(CPDPolicy(), PPDConfig("dynamic"))
        decider.model.steps[None] = sm
        decider.feedback = None          # no exploring: the first decision is scored
        workers = WORKERS[:3] + [w("d1", "decode", running=running), w("d2", "decode", running=1)]
        d = decider.decide_route(rv, snapshot(decider, hits, "d1", workers))
        assert f"{running} running" in d.ppd_reason and d.ppd in ("local", "remote")
        assert predicted_headers(d)["X-Warmpath-PPD"] == d.ppd_reason
        scores[running] = float(d.ppd_reason.split("S=")[1].split(" ")[0])
    assert scores[2] < scores[0]


def test_the_ppd_feedback_keeps_a_turns_ttft_less_its_predicted_queue_wait():
    from warmpath.routing.views import Decision

    decider = RouteDecider(CPDPolicy(), PPDConfig("dynamic"))
    key = (1, 0, 0)
    remote = Decision("p1", "d1", "warm", 2.0, 0, "", ppd="remote", bucket=key, ppd_queue_s=1.5)
    decider.observe_outcome(remote, 2.0, 0.03)          # 2.0 s, 1.5 of them queued: 0.5 s served
    st = decider.feedback.paths[(key, "remote")]
    assert (st.ttft.samples, st.ttft.value, st.tpot.value) == (1, pytest.approx(0.5), pytest.approx(0.03))
    decider.observe_outcome(replace(remote, ppd_queue_s=3.0), 2.0, None)   # queue overestimated: 0, not -1
    assert st.ttft.value == pytest.approx(0.7 * 0.5 + 0.3 * 0.0) and st.tpot.samples == 1


def test_a_request_without_max_tokens_is_booked_at_the_budget_the_worker_will_give_it():
    """Not 128: the workers' registered default (1,024 on SmolLM2's), capped at the context
    left as a worker caps it; the client's own max_tokens when it sent one."""
    views = [WorkerView("p0", "prefill"), WorkerView("d0", "decode", default_max_tokens=1024)]
    assert answer_budget(None, views, 1000, 8192) == 1024
    assert answer_budget(None, views, 7900, 8192) == 292          # the context left
    assert answer_budget(None, views, 8192, 8192) == 1            # at least one token
    assert answer_budget(50, views, 1000, 8192) == 50
    assert answer_budget(None, views, 1000, None) == 1024
    assert answer_budget(None, [WorkerView("d0", "decode")], 1000, 8192) == 7192   # no default: the room left
    with pytest.raises(LookupError, match="default max_tokens"):
        answer_budget(None, [WorkerView("d0", "decode")], 1000, None)

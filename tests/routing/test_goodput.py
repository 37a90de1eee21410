"""The goodput policy's path decision (routing/goodput.py), on hand-built fleets.

Step model as in test_predict.py: decode = 0.010 + 0.001·b; mixed = 0.010 + 0.0001·t +
0.001·b; prefill alone = 0.005 + 0.0001·t. Remote TTFTs come from the heartbeat prior
(work units at prefill_tok_s, + the write-through's 2 ms; kv_bytes_per_token 0).
"""

from dataclasses import replace

import pytest

from warmpath.slo import Target
from warmpath.engine.step_model import StepModel
from warmpath.routing.goodput import SLACK_SHARE, GoodputConfig, choose, local_harm_s, paths, planned, score
from warmpath.routing.latency import RouterModel
from warmpath.routing.policy import GoodputPolicy
from warmpath.routing.route import RouteDecider
from warmpath.routing.views import PrefixHit, RequestView, Snapshot, WorkerView

SM = StepModel((0.005, 0.0001, 0.0), (0.010, 0.001, 0.0), mixed_coef=(0.010, 0.0001, 0.0, 0.001, 0.0),
               mixed_rows=10)


def fleet(running=4, p_queue=0, c0=False):
    ws = [WorkerView("d0", "decode", chunk_tokens=512, running=running, running_tokens=1000 * running),
          WorkerView("p0", "prefill", chunk_tokens=512, queued_prefill_tokens=p_queue, prefill_tok_s=1000)]
    return ws + [WorkerView("c0", "pre-prefill", chunk_tokens=512, prefill_tok_s=1000)] * c0


def snap(workers, hits=None, arrivals=None, session_decode="d0"):
    m = RouterModel(kv_bytes_per_token=0, steps={None: SM})
    m.hop_s.value = 0.0
    return Snapshot(workers, hits or {}, session_decode, 0, model=m, arrivals_s=arrivals or {})


def policy(spec, **kw):
    """The hand-worked cases below price the bound itself (slack share 1) unless they say."""
    return GoodputPolicy(GoodputConfig(Target.parse(spec), **{"slack_share": 1.0, **kw}))


def follow_up():
    """Turn 2: 2000 tokens, 1008 of them (63 blocks) cached on d0 and on p0; 992 new."""
    return (RequestView(2000, (), 16, "s", 2, new_tokens=992, max_tokens=100),
            {"d0": PrefixHit(63), "p0": PrefixHit(63)})


def test_a_follow_up_goes_local_when_the_decode_batch_has_slack():
    rv, hits = follow_up()
    d = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.05").route(rv, snap(fleet(), hits))
    # local: 508 + 484 tokens in two mixed steps, 0.0648 + 0.0624; both paths keep all 5
    assert (d.prefill, d.decode, d.path, d.cls) == (None, "d0", "local", "warm")
    assert d.est_ttft_s == pytest.approx(0.1272) and d.est_tpot_s == pytest.approx(0.015)
    assert d.est_running_tpot_s == pytest.approx((0.1272 + 98 * 0.015) / 100)
    assert "local keeps 5" in d.reason


def test_a_follow_up_goes_remote_when_local_would_push_the_running_past_the_tpot_bound():
    rv, hits = follow_up()
    sn = snap(fleet(), hits)
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0155")
    got = {s.pred.path: s.kept for s in score(rv, sn, pol.cfg, "warm", paths(rv, sn, pol.cfg))}
    assert got == {"local": 1, "warm": 5}          # local: the 4 running at 0.01597 > 0.0155
    d = pol.route(rv, sn)
    assert (d.prefill, d.decode, d.path) == ("p0", "d0", "warm")
    # 992 new after 1008 cached: 992·(1 + (1008 + 496)/8192) work units at 1000/s + 2 ms
    assert d.est_ttft_s == pytest.approx(992 * (1 + 1504 / 8192) / 1000 + 0.002)
    assert d.est_running_tpot_s == pytest.approx(0.015)


def test_a_turn1_short_prompt_goes_local_on_an_idle_decode_worker():
    rv = RequestView(200, (), 16, None, 1, max_tokens=100)
    d = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.05").route(rv, snap(fleet(running=0), session_decode=None))
    assert (d.prefill, d.decode, d.path, d.cls) == (None, "d0", "local", "cold")
    assert d.est_ttft_s == pytest.approx(0.025)    # the prefill line alone: 0.005 + 0.0001·200
    assert d.est_tpot_s == pytest.approx(0.011)


def test_the_decider_learns_rho_and_kappa_from_a_local_answer():
    rv = RequestView(200, (), 16, None, 1, max_tokens=100)
    dec = RouteDecider(policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.05"))
    sn = snap(fleet(running=0), session_decode=None)
    dec.model = sn.model
    d = dec.decide_route(rv, sn)
    assert d.path == "local" and d.est_ttft_parts == (0.0, pytest.approx(0.025))
    assert d.est_tpot_parts == (0.0, pytest.approx(0.011))
    # measured 0.05 s to the first token, 0.022 s per token: κ = 2 at once, ρ = 2 from the third
    dec.observe_outcome(d, 0.05, 0.022)
    assert dec.model.params()["chunk_scale"] == {"d0": 1.0} and dec.model.params()["tpot_scale"] == {"d0": 2.0}
    dec.observe_outcome(d, 0.05, 0.022)
    dec.observe_outcome(d, 0.05, 0.022)
    assert dec.model.params()["chunk_scale"] == {"d0": 2.0}
    d = dec.decide_route(rv, sn)
    assert (d.est_ttft_s, d.est_tpot_s) == (pytest.approx(0.05), pytest.approx(0.022))


def test_a_request_with_slack_lends_it_and_one_at_risk_borrows():
    rv = RequestView(1000, (), 16, None, 1, max_tokens=100)
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20", local=False)
    # cold (20 s) request, both tiers idle and as fast: warm arrivals make the warm tier cost
    # it 10x (its bound over theirs): the cold tier
    d = pol.route(rv, snap(fleet(c0=True), arrivals={"warm": 1.0, "cold": 0.1}, session_decode=None))
    assert (d.prefill, d.path, d.cls) == ("c0", "cold", "cold")
    # with cold arrivals 100x the warm ones, the cold tier costs it more: the warm tier
    d = pol.route(rv, snap(fleet(c0=True), arrivals={"warm": 0.01, "cold": 1.0}, session_decode=None))
    assert (d.prefill, d.path, d.cls) == ("p0", "warm", "cold")
    # a warm request the warm tier's 3 s queue would make late: it borrows the cold tier
    hits = {"p0": PrefixHit(40), "c0": PrefixHit(40)}
    sn = snap(fleet(p_queue=3000, c0=True), hits, {"warm": 1.0, "cold": 0.1}, None)
    kept = {s.pred.prefill: s.kept for s in score(rv, sn, pol.cfg, "warm", paths(rv, sn, pol.cfg))}
    assert kept == {"p0": 4, "c0": 5}
    assert pol.route(rv, sn).prefill == "c0"


def test_no_local_path_after_a_failure_and_no_ppd_switch():
    rv, hits = follow_up()
    dec = RouteDecider(policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.05"))
    dec.model = snap(fleet(), hits).model
    views = fleet()
    sn = dec.snapshot(views, lambda w: hits.get(w, PrefixHit()), "d0", 0)
    assert set(sn.hits) == {"d0", "p0"}            # every decode worker is looked up
    assert dec.decide_route(rv, sn).path == "local"
    d = dec.decide_route(rv, sn, allow_local=False, arrival=False)
    assert (d.prefill, d.path, d.ppd) == ("p0", "warm", None)
    with pytest.raises(LookupError):
        choose([])


def test_config_is_validated():
    with pytest.raises(ValueError, match="must be a warmpath.slo.Target, got dict"):
        GoodputConfig(target={"ttft": 2})
    assert GoodputConfig().bound(["warm"], "ttft") is None
    assert GoodputConfig(Target.parse("warm.tpot=0.05,cold.tpot=0.2")).running_tpot_bound() == 0.05


def test_a_local_path_never_pushes_the_running_past_their_bound_while_another_path_keeps_this_one():
    # d0 runs one decode (at 0.011 s, within 0.0129); p0 has a 3 s queue, so the remote path misses
    # this turn's 2 s TTFT bound while local keeps it: each path keeps one request
    rv, hits = follow_up()
    ws = fleet(running=1, p_queue=3000)
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0129", hold_step_s=0.0)
    sn = snap(ws, hits)
    got = {s.pred.path: (s.kept, s.over, s.ttft_ok) for s in score(rv, sn, pol.cfg, "warm", paths(rv, sn, pol.cfg))}
    # local: 511 + 481 tokens beside 1 decode (0.0621 + 0.0591): the running one at
    # (0.1212 + 98·0.012) / 100 = 0.012972 > 0.0129: pushed over; remote leaves it at 0.012
    assert got == {"local": (1, True, True), "warm": (1, False, False)}
    # no path but the one that pushes keeps this turn's TTFT: the most kept, then the lowest TTFT
    assert pol.route(rv, sn).path == "local"
    # p0 with a 0.5 s queue: the warm tier keeps this turn within 2 s and spares the running one
    near = snap(fleet(running=1, p_queue=500), hits)
    d = pol.route(rv, near)
    assert d.path == "warm" and 1 < d.est_ttft_s < 2          # not the lower TTFT
    assert pol.route(rv, snap([ws[0]], hits)).path == "local"   # no other path: it runs
    # already past the bound (0.011 > 0.0105): at risk on every path here (d0 is the only decode
    # worker), and local pushes nobody over who was within it
    late = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0105", hold_step_s=0.0)
    got = {s.pred.path: (s.kept, s.over) for s in score(rv, sn, late.cfg, "warm", paths(rv, sn, late.cfg))}
    assert got == {"local": (0, False), "warm": (0, False)}
    assert late.route(rv, sn).path == "local"


def test_a_document_with_slack_pays_for_the_decodes_its_local_chunks_stretch():
    # 1000 new tokens, idle fleet: local in 512 + 488 tokens alone (0.0562 + 0.0538 = 0.11 s)
    # vs the warm tier (1.063 s); no warm arrivals, so the tier's harm is 0
    rv = RequestView(1000, (), 16, None, 1, max_tokens=100)
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.05")
    calm = pol.route(rv, snap(fleet(running=0), arrivals={"cold": 0.1}, session_decode=None))
    # λ 0.1: 0.1·0.11·0.055 / (0.05·100) s in TPOT bounds, ×20 (its bound): 0.0024 s
    assert calm.path == "local" and "harm 0.002s" in calm.reason
    sn = snap(fleet(running=0), arrivals={"cold": 50.0}, session_decode=None)
    # λ 50: harm 1.21 s, so local costs 0.11 + 1.21 > 1.063: the warm tier
    busy = pol.route(rv, sn)
    assert busy.path == "warm" and "harm 0.000s" in busy.reason
    local = next(s for s in score(rv, sn, pol.cfg, "cold", paths(rv, sn, pol.cfg)) if s.pred.path == "local")
    assert local.harm_s == pytest.approx(50 * 0.11 * 0.055 / (0.05 * 100) * 20)
    # queued prompts ahead (0.5 s): those arriving meanwhile pay all 0.11 s
    assert local_harm_s(replace(local.pred, queued_s=0.5), sn, 0.05, 100) == \
        pytest.approx(50 * 0.11 * (0.5 + 0.055) / (0.05 * 100))
    # a bound no decode there meets, even alone (0.01 < 0.011 s): no one to harm, local again
    assert policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.01").route(rv, sn).path == "local"
    assert local_harm_s(local.pred, sn, None, 100) == 0.0
    assert local_harm_s(local.pred, sn, 0.05, 100, lone_s=0.06) == 0.0


def test_a_decode_worker_past_its_bound_is_not_where_the_next_request_goes():
    # d0 decodes 3 (0.013 s per token, past the 0.0115 bound), d1 decodes 1 (0.011, within): a
    # turn 1 that misses the bound on either (0.014 on d0, 0.012 on d1) goes to d1 and risks its
    # one request, not to d0 and its three (at risk, not lost: their TPOT is their whole answer's)
    ws = [WorkerView("d0", "decode", chunk_tokens=512, running=3, running_tokens=3000),
          WorkerView("d1", "decode", chunk_tokens=512, running=1, running_tokens=1000),
          WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=1000)]
    rv = RequestView(1000, (), 16, None, 1, max_tokens=100)
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0115", local=False)
    sn = snap(ws, session_decode=None)
    got = {s.pred.decode: s.kept for s in score(rv, sn, pol.cfg, "cold", paths(rv, sn, pol.cfg))}
    assert got == {"d0": 4 - 3, "d1": 4 - 1}
    assert pol.route(rv, sn).decode == "d1"


def test_a_replica_takes_handoffs_from_the_cold_tier():
    """A cold tier beside replicas: a document may be computed on a replica (local) or on the
    pre-prefill worker and handed to either replica to decode."""
    ws = [WorkerView("r0", "replica", chunk_tokens=512, running=2, running_tokens=2000), WorkerView("r1", "replica", chunk_tokens=512),
          WorkerView("c0", "pre-prefill", chunk_tokens=512, prefill_tok_s=1000)]
    rv = RequestView(4000, (), 16, None, 1, max_tokens=100)
    pol = policy("ttft_p90=2,tpot=0.05")
    got = {(p.path, p.prefill, p.decode) for p in paths(rv, snap(ws, session_decode=None), pol.cfg)}
    assert got == {("local", None, "r0"), ("local", None, "r1"), ("cold", "c0", "r0"), ("cold", "c0", "r1")}



def test_planned_takes_a_share_of_the_slack_over_the_unloaded_tpot():
    assert planned(0.02, 0.01, 0.5) == pytest.approx(0.015)
    assert planned(0.02, 0.01, 1.0) == 0.02 and planned(None, 0.01, 0.5) is None
    assert planned(0.009, 0.01, 0.5) == 0.009          # no slack left: the bound itself
    assert GoodputConfig().slack_share == SLACK_SHARE == 0.5
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="slack_share"):
            GoodputConfig(slack_share=bad)


def test_half_the_slack_keeps_a_follow_up_off_a_decode_worker_it_would_pack_near_the_bound():
    """Bound 0.02; a lone decode step is 0.011, so half the slack plans for 0.0155. Local
    leaves the 4 running at 0.01597 (within 0.02, past 0.0155), remote at 0.015."""
    rv, hits = follow_up()
    sn = snap(fleet(), hits)
    spec = "warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.02"
    full, half = policy(spec), policy(spec, slack_share=0.5)
    assert {s.pred.path: s.kept for s in score(rv, sn, full.cfg, "warm", paths(rv, sn, full.cfg))} == \
        {"local": 5, "warm": 5}
    assert full.route(rv, sn).path == "local"          # a tie: the lower TTFT
    assert {s.pred.path: s.kept for s in score(rv, sn, half.cfg, "warm", paths(rv, sn, half.cfg))} == \
        {"local": 1, "warm": 5}
    assert half.route(rv, sn).prefill == "p0"


def test_a_request_that_would_push_the_decodes_past_their_bound_is_held_while_its_ttft_has_slack():
    # as above: local (TTFT 0.1212 s) pushes d0's decode to 0.012972 > 0.0129, the warm tier
    # misses this turn's 2 s TTFT: local is the best path, and this turn alone on d0 decodes at
    # 0.011 s: held 0.1 s, then decided again, while held + 0.1 + 0.1212 <= 0.75 x 2 s
    rv, hits = follow_up()
    sn = snap(fleet(running=1, p_queue=3000), hits)
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0129")
    d = pol.route(rv, sn)
    assert (d.path, d.hold_s) == ("local", 0.1) and d.reason.endswith("; hold 0.10s")
    assert pol.route(replace(rv, waited_s=1.27), sn).hold_s == 0.1      # 1.27 + 0.1 + 0.1212 = 1.4912
    d = pol.route(replace(rv, waited_s=1.3), sn)                         # 1.5212 > 1.5: it goes
    assert (d.path, d.hold_s) == ("local", 0.0) and d.reason.endswith("; held 1.30s")
    # nothing running on d0: nobody to push, it goes at once
    assert pol.route(rv, snap(fleet(running=0, p_queue=3000), hits)).hold_s == 0.0
    # no TPOT bound, the hold off, or a bound this turn misses even alone on d0 (0.011 > 0.0105): never held
    assert policy("warm.ttft_p90=2,cold.ttft_p90=20").route(rv, sn).hold_s == 0.0
    assert policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0129", hold_step_s=0.0).route(rv, sn).hold_s == 0.0
    assert policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0105").route(rv, sn).hold_s == 0.0
    with pytest.raises(ValueError, match="hold_share"):
        GoodputConfig(hold_share=1.5)


def test_a_request_still_computing_its_prompt_is_stretched_only_by_the_chunks_queued_after_it():
    # d0 runs one request still computing its 1000-token prompt (511 + 489 tokens, priced beside
    # the one running: 0.0621 + 0.0599 = 0.122 s queued). A 1000-token document local: its own chunks
    # (0.122 s) then stretch that request's first decodes: (0.122 + 98 x 0.012) / 100 = 0.01298 >
    # 0.0125; handed off it leaves it at decode(2) = 0.012. Counted as decoding now, it would be
    # stretched by its own chunks too and lost on both paths (0.01396 and 0.01298)
    rv = RequestView(1000, (), 16, None, 1, max_tokens=100)
    ws = [WorkerView("d0", "decode", chunk_tokens=512, queued_prefill_tokens=1000, running=1, running_tokens=1000, prefilling=1),
          WorkerView("p0", "prefill", chunk_tokens=512, prefill_tok_s=1000)]
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0125", hold_step_s=0.0)
    sn = snap(ws, session_decode=None)
    got = {s.pred.path: s for s in score(rv, sn, pol.cfg, "cold", paths(rv, sn, pol.cfg))}
    assert got["local"].pred.prefilling_tpot_s == pytest.approx(0.01298)
    assert got["warm"].pred.prefilling_tpot_s == pytest.approx(0.012)
    assert (got["local"].kept, got["local"].over, got["warm"].kept, got["warm"].over) == (1, True, 2, False)
    assert pol.route(rv, sn).path == "warm"


def test_the_router_decides_a_held_request_again_until_it_goes():
    # router/flow.py's hold: d0 busy (as above: held 0.1 s), then idle at the second decision
    import asyncio
    from types import SimpleNamespace

    from warmpath.router.flow import RequestFlow
    from warmpath.router.metrics import RouterMetrics

    rv, hits = follow_up()
    busy, idle = snap(fleet(running=1, p_queue=3000), hits), snap(fleet(running=0, p_queue=3000), hits)
    seen = []

    def snapshot(r, session_decode):
        seen.append(r.waited_s)
        return busy if len(seen) == 1 else idle

    from warmpath.routing.admission import Admission, AdmissionConfig
    from warmpath.routing.ledger import RequestLedger
    from warmpath.routing.sessions import SessionTable

    decider = RouteDecider(policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0129"))
    state = SimpleNamespace(decider=decider, snapshot=snapshot, metrics=RouterMetrics(),
                            ledger=RequestLedger(decider, Admission(AdmissionConfig()), SessionTable(), list))
    flow = RequestFlow(state, None)
    d = flow.decide_route(rv, None)
    assert d.hold_s == 0.1
    d = asyncio.run(flow._hold(rv, None, d))
    assert (d.path, d.hold_s) == ("local", 0.0) and len(seen) == 2 and 0.1 <= seen[1] < 0.5
    assert "held 0." in d.reason and state.metrics.held._sum.get() == pytest.approx(seen[1], abs=0.05)


def test_a_handoff_whose_first_token_comes_after_the_running_answers_is_not_held():
    # handed to d0 (one decode running) its TPOT is decode(2) = 0.012 > 0.0115, while alone it
    # would decode at 0.011: held — if its first token (p0: 1.063 s) comes within a lone answer's
    # time (100 x 0.011 = 1.1 s); with a 50-token answer (0.55 s) the decode running now has
    # ended by then, held or not: sent at once
    rv = RequestView(1000, (), 16, None, 1, max_tokens=100)
    sn = snap(fleet(running=1), session_decode=None)
    pol = policy("warm.ttft_p90=2,cold.ttft_p90=20,tpot=0.0115")
    d = pol.route(rv, sn, allow_local=False)
    assert (d.path, d.hold_s) == ("warm", 0.1) and d.est_ttft_s == pytest.approx(1.063, abs=1e-3)
    assert pol.route(replace(rv, max_tokens=50), sn, allow_local=False).hold_s == 0.0

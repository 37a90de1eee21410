"""The request ledger (routing/ledger.py): admit → hold → dispatch → end / abandon, worked by hand."""

import pytest

from warmpath.routing.admission import Admission, AdmissionConfig
from warmpath.routing.ledger import RequestLedger
from warmpath.routing.policy import ReplicaPolicy
from warmpath.routing.route import RouteDecider
from warmpath.routing.sessions import SessionTable
from warmpath.routing.views import Decision, RequestView, WorkerView

FLEET = [WorkerView("r0", "replica", max_seqs=4, kv_tokens=100_000)]


def ledger(limit=2, queues=None):
    adm = Admission(AdmissionConfig(max_in_flight=limit, queue_limits=queues or {"cold": 1, "warm": 1}))
    return RequestLedger(RouteDecider(ReplicaPolicy()), adm, SessionTable(), lambda: FLEET)


RV = RequestView(100, (), 16, max_tokens=10)


def decision(cls="warm", est_ttft_s=0.5):
    return Decision(None, "r0", "replica", est_ttft_s, 0, "test", cls=cls)


def test_admit_queues_then_rejects_and_a_release_wakes_the_oldest_waiter():
    led = ledger(limit=2)
    assert [led.admit(k, RV, decision()) for k in ("a", "b", "c", "d")] == ["run", "run", "queued", "rejected"]
    assert led.admit("e", RV, decision("cold")) == "queued"       # the cold queue has its own place
    assert led.release() == ["c"]                              # the oldest waiter first
    assert led.release() == ["e"]
    assert led.release() == [] and led.admission.in_flight == 1


def test_a_waiter_that_leaves_is_dropped_and_one_given_a_slot_must_release_it():
    led = ledger(limit=1)
    assert (led.admit("a", RV, decision()), led.admit("b", RV, decision())) == ("run", "queued")
    assert led.abandoned_waiting("b") is True                  # still queued: nothing else to free
    assert led.release() == [] and led.admission.in_flight == 0
    assert (led.admit("c", RV, decision()), led.admit("d", RV, decision())) == ("run", "queued")
    assert led.release() == ["d"]                              # d got c's slot ...
    assert led.abandoned_waiting("d") is False                 # ... so leaving, it must hand it on
    assert led.release() == [] and led.admission.in_flight == 0


def test_dispatch_counts_the_turn_and_the_end_books_session_model_and_slot():
    led = ledger()
    sess = led.sessions.touch("s", 0.0)
    assert led.admit("a", RV, decision()) == "run"
    led.dispatched(sess)
    assert sess.turns == 1
    end = led.ended(decision(est_ttft_s=0.5), 1000, 24, ttft_s=0.4, tpot_s=None, sess=sess)
    assert (sess.decode_worker, sess.context_tokens) == ("r0", 1024)    # the next turn's history
    assert end.ttft_err == pytest.approx((0.5 - 0.4) / 0.4) and end.tpot_err is None
    assert end.woken == [] and led.admission.in_flight == 0
    assert list(led.admission.sizes) == [1024]                 # the KV it held, for the fleet's limit
    led.dispatched(None)                                       # no session: nothing to count


def test_a_held_request_is_decided_again_knowing_how_long_it_was_held():
    rv = RequestView(100, (), 16, max_tokens=8)
    assert RequestLedger.held(rv, held_since=2.0, now=2.75).waited_s == 0.75
    assert rv.waited_s == 0.0

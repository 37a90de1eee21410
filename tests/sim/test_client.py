"""The simulated client (sim/client.py): the client-side cap on hand-worked timelines, and
the classes from what the simulated cache gave — by the bench's own rule (same objects)."""

from tests.sim.test_simulator import one_turn, run, setup
from warmpath.bench import reuse, runner
from warmpath.bench.workload import Session, Turn
from warmpath.launch.topology import Topology
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim import client

ONE = Topology("one", "replica", {"replica": 1})


def timeline(recs):
    return {r.sid: (round(r.ttft, 9), round(r.e2e, 9), round(r.client_wait_s, 9)) for r in recs}


def test_client_cap_sends_when_a_slot_frees_and_times_ttft_from_the_send():
    """One worker, 0.1 s per step, 4 tokens out: a request takes 0.4 s (prefill, 3 decodes).
    Three at t=0, at most one in flight: b is sent at 0.4 and c at 0.8; each sees its first
    token 0.1 s after its send."""
    sim, recs = run(setup(ONE, max_concurrency=1), [one_turn("a", 0.0), one_turn("b", 0.0, seed=100),
                                                    one_turn("c", 0.0, seed=200)])
    assert timeline(recs) == {"a": (0.1, 0.4, 0.0), "b": (0.1, 0.4, 0.4), "c": (0.1, 0.4, 0.8)}
    assert sim.client.in_flight == 0 and not sim.client.waiting


def test_server_side_admission_times_ttft_from_arrival():
    """The same three held by the router's admission (one in flight) instead: the wait is
    inside TTFT and E2E."""
    _, recs = run(setup(ONE, admission=AdmissionConfig(1)), [one_turn("a", 0.0), one_turn("b", 0.0, seed=100),
                                                             one_turn("c", 0.0, seed=200)])
    assert timeline(recs) == {"a": (0.1, 0.4, 0.0), "b": (0.5, 0.8, 0.0), "c": (0.9, 1.2, 0.0)}


def test_a_sessions_next_turn_queues_behind_those_already_waiting():
    """Cap 1: a's turn 2 becomes ready when turn 1 ends (0.4), after b (waiting since 0): b
    goes first, a's turn 2 is sent at 0.8."""
    a = Session("a", [Turn(list(range(1000, 1032)), 4), Turn(list(range(2000, 2016)), 4)])
    _, recs = run(setup(ONE, max_concurrency=1), [a, one_turn("b", 0.0, seed=100)])
    waits = sorted((r.sid, r.turn, round(r.client_wait_s, 9)) for r in recs)
    assert waits == [("a", 1, 0.0), ("a", 2, 0.4), ("b", 1, 0.4)]


def test_classes_are_what_the_cache_gave_not_the_label():
    """a and b labelled cold, c warm. b sends a's 64-token prompt again after a finished: the worker's
    prefix cache gives it 48 tokens (the last block is recomputed), so b is warm; c extends a's
    prompt by 80 tokens (a one-turn request, as a trace row): turn 2, and 64 of 144 reused: cold."""
    p = list(range(1000, 1064))
    sessions = [Session("a", [Turn(p, 4, "cold")]), Session("b", [Turn(p, 4, "cold")], start=1.0),
                Session("c", [Turn(p + list(range(5000, 5080)), 4, "warm")], start=2.0)]
    _, recs = run(setup(ONE), sessions)
    assert [(r.sid, r.turn, r.cached_tokens, r.cls, r.reuse) for r in recs] == [
        ("a", 1, 0, "cold", "cached"), ("b", 1, 48, "warm", "cached"), ("c", 2, 64, "cold", "cached")]


def test_a_failed_request_is_classed_by_its_overlap():
    """Admission holds none beyond the one in flight (queue 0): b, a's prompt again at the
    same instant, is rejected; it had not been computed, but its whole prompt was sent before."""
    p = list(range(1000, 1064))
    s = setup(ONE, admission=AdmissionConfig(1, {"cold": 0, "warm": 0}))
    _, recs = run(s, [Session("a", [Turn(p, 4)]), Session("b", [Turn(p, 4)])])
    assert [(r.sid, r.ok, r.cls, r.reuse) for r in recs] == [("a", True, "cold", "cached"),
                                                             ("b", False, "warm", "overlap")]


def test_sim_and_bench_use_the_same_classifier():
    assert client.measured_class is runner.measured_class is reuse.measured_class
    assert client.PrefixOverlap is runner.PrefixOverlap is reuse.PrefixOverlap

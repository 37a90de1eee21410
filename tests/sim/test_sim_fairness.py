"""The simulator's defects that biased the aggregated arm, and the bench's client timeout,
on hand-worked timelines (0.1 s per step, ``test_simulator.Constant``)."""

import pytest

from warmpath.bench.workload import Session, Turn
from warmpath.launch.topology import Topology
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim.run import build, hit_ratio, simulate_rate

from .test_simulator import one_turn, run, setup

REPLICAS = Topology("r3", "replica", {"replica": 3})
PD = Topology("pd", "pd", {"prefill": 1, "decode": 1})


def test_idle_replicas_take_requests_in_turn():
    """Six requests one at a time (each ends before the next arrives), no shared prefix, prompts
    too short to update a speed: every replica looks the same, so they go round-robin (it was
    6 / 0 / 0: replica-0 won every tie)."""
    sim, recs = run(setup(REPLICAS), [one_turn(f"s{i}", float(i), seed=100 * i) for i in range(6)])
    assert all(r.ok for r in recs)
    assert sim.stats.routed == {"replica-0": 2, "replica-1": 2, "replica-2": 2}


def test_replicas_report_the_prefill_speed_they_measured():
    """A 128-token prompt in one 0.1 s step: 1,280 tokens/s, the speed replica-0 now heartbeats
    (its prior was the step model's 10,000); the next request goes to an unmeasured replica."""
    sim, _ = run(setup(REPLICAS), [one_turn("a", 0.0, n=128), one_turn("b", 1.0, n=128, seed=500)])
    r0 = sim.workers["replica-0"].view()
    assert r0.prefill_tok_s == pytest.approx(1280.0)
    assert sim.workers["replica-1"].view().prefill_tok_s == pytest.approx(1280.0)
    assert sim.workers["replica-2"].view().prefill_tok_s == 1e4
    assert sim.stats.routed == {"replica-0": 1, "replica-1": 1}


def test_a_handoff_load_is_no_prefix_hit():
    """One 64-token PD request: the prefill worker finds nothing, the decode worker loads the
    4 handed-off blocks. The prefix hit ratio is 0 (it was 64 / 128 = 0.5); the load is
    reported apart."""
    sim, _ = run(setup(PD), [one_turn("a", 0.0, n=64)])
    assert hit_ratio(sim.workers.values()) == {"all_tiers": 0.0, "prefix_hit_tokens": 0, "prefix_query_tokens": 64,
                                               "handoff_loaded_tokens": 64, "handoff_tokens": 64}


def test_a_request_past_the_client_timeout_fails_and_is_aborted():
    """Replica: tokens at 0.1, 0.2, 0.3, 0.4 s; the client gives up at 0.25 s. The record fails
    as bench's would, the step after it (0.3 s) aborts it, so the worker runs 3 steps not 4,
    the slot is free again and the session's second turn is never sent."""
    s = Session("a", [Turn(list(range(1000, 1032)), 4), Turn(list(range(2000, 2016)), 4)])
    sim = build(setup(Topology("one", "replica", {"replica": 1}), timeout_s=0.25))
    (r,) = sim.run([s])
    assert (r.ok, r.error, r.ttft, r.turn) == (False, "TimeoutError: no answer within 0.25 s", None, 1)
    w = sim.workers["replica-0"]
    assert w.steps == 3 and not w.sched.running and not w.sched.waiting and sim.admission.in_flight == 0
    w.pool.check_integrity()
    assert r.route["path"] == "replica" and r.route["decode"] == "replica-0"


def test_timeouts_abort_in_decode_in_prefill_and_in_a_worker_queue():
    """PD, one request in flight at most, 10-token answers, a 0.5 s client timeout. a: first
    token at 0.1 s, decode steps from 0.1 s; at 0.5 s it is abandoned (the decode worker ran 4
    steps of its 9) and its slot goes to b (queued since 0.05 s), whose prefill step runs
    0.5-0.6 s but whose client gives up at 0.55 s; its slot goes to c (queued since 0.06 s),
    waiting at the prefill worker behind b's step when its client gives up at 0.56 s: aborted
    before it ran. Nothing is left held anywhere."""
    sim = build(setup(PD, timeout_s=0.5, admission=AdmissionConfig(1)))
    sessions = [one_turn("a", 0.0, n=64, out=10), one_turn("b", 0.05, n=64, out=10, seed=300),
                one_turn("c", 0.06, n=64, out=10, seed=600)]
    recs = {r.sid: r for r in sim.run(sessions)}
    assert {k: (r.ok, r.error) for k, r in recs.items()} == {
        k: (False, "TimeoutError: no answer within 0.5 s") for k in "abc"}
    assert [recs[k].route["prefill"] for k in "abc"] == ["prefill-0"] * 3
    p, d = sim.workers["prefill-0"], sim.workers["decode-0"]
    assert (p.steps, d.steps) == (2, 4) and sim.now == pytest.approx(0.6)
    assert sim.admission.in_flight == 0 and not sim._queued and not sim._by_seq
    for w in (p, d):
        assert not w.sched.running and not w.sched.waiting
        w.pool.check_integrity()


def test_simulate_rate_writes_what_requests_jsonl_needs():
    """PD at 1 session/s for 2 s: every request's row names its path and the router's estimate."""
    res = simulate_rate(setup(PD), lambda n, seed: [one_turn(f"s{i}", 0.0, n=64, seed=97 * i) for i in range(n)],
                        1.0, 2.0, "ttft=1,tpot=0.2", seed=3)
    rows = res["requests"]
    assert len(rows) == res["classes"]["all"]["completed"] > 0
    row = rows[0]
    assert (row["path"], row["prefill"], row["decode"], row["ppd"], row["rate"]) == ("pd", "prefill-0", "decode-0",
                                                                                    None, 1.0)
    assert row["predicted_ttft_s"] > 0 and row["cached_by_tier"] == {"L1": 0, "L2": 0, "L3": 0}
    assert row["attained"] and row["ttft_s"] == pytest.approx(0.1) and row["tpot_s"] == pytest.approx(0.1)
    assert res["attained"] and res["offered_rps"] == 1.0 and res["classes"]["all"]["attainment"] == 1.0

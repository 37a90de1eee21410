"""A simulated worker's step trace (``SimWorker.trace``, the rows a real worker's
``--step-trace`` writes) and the router's admission wait in a simulated request's
``server_timing`` — on hand-worked timelines."""

from tests.sim.test_simulator import one_turn, setup
from warmpath.launch.topology import Topology
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim.run import build

ONE = Topology("one", "replica", {"replica": 1})


def test_every_step_is_traced_with_its_times_and_items():
    """One worker, 0.1 s per step; a (32 tokens, 3 out) at 0, alone: its prompt in one step
    (32 tokens over 0 cached), then two decodes (context 32, then 33); nothing loaded."""
    sim = build(setup(ONE))
    w = sim.workers["replica-0"]
    w.trace = []
    sim.run([one_turn("a", 0.0, out=3)])
    rows = [(round(r["t0"], 9), round(r["t1"], 9), round(r["exec_s"], 9), r["tiers_s"], r["items"], r["model_s"])
            for r in w.trace]
    assert rows == [(0.0, 0.1, 0.1, 0.0, [(32, 0)], 0.1), (0.1, 0.2, 0.1, 0.0, [(1, 32)], 0.1),
                    (0.2, 0.3, 0.1, 0.0, [(1, 33)], 0.1)]


def test_no_trace_unless_asked():
    sim = build(setup(ONE))
    sim.run([one_turn("a", 0.0)])
    assert sim.workers["replica-0"].trace is None


def test_the_route_stage_is_the_admission_wait():
    """One in flight (admission 1), 0.1 s steps, 4 tokens out: a runs 0–0.4; b, arriving at 0,
    is admitted when a ends (0.4): its route stage 0.4 s, a's 0."""
    sim = build(setup(ONE, admission=AdmissionConfig(1)))
    recs = sorted(sim.run([one_turn("a", 0.0), one_turn("b", 0.0, seed=100)]), key=lambda r: r.sid)
    assert [round(r.route["server_timing"]["route"], 9) for r in recs] == [0.0, 0.4]

"""The goodput policy in the simulator: the same RouteDecider decision, end to end, with the
predictions recorded beside the measurements (requests.jsonl's fields)."""

from collections import Counter

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.bench.requests_log import ROUTE_KEYS
from warmpath.slo import Target
from warmpath.bench.workload import coding_agent
from warmpath.launch.topology import resolve
from warmpath.routing.policy import GoodputPolicy
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.map_cpd import arm_setup, cpd_topology
from warmpath.sim.run import SimSetup, build, simulate_rate
from warmpath.sim.step_time import Roofline


def setup(spec="warm.ttft_p90=2,cold.ttft_p90=20"):
    return SimSetup(resolve("cpd-2d", None, "goodput"), MODELS["llama-3.1-8b"], HARDWARE["b200"],
                    tp={"pre-prefill": 4, "prefill": 4}, target=Target.parse(spec))


def sessions(n=40, rate=2.0, seed=3):
    ss = coding_agent(n, seed, context=1024, doc_tokens=4096)
    for s, t in zip(ss, arrival_times(ArrivalConfig(rate, 20.0, seed=seed))):
        s.start = t
    return ss


def test_goodput_runs_end_to_end_with_its_predictions_recorded():
    sim = build(setup())
    assert type(sim.decider.policy) is GoodputPolicy
    assert sim.workers["decode-0"].view().chunk_tokens == 16384    # vLLM's chunk on a B200, as a worker registers it
    assert sim.decider.model.steps == {}     # a GPU fleet's router starts knowing no step times (it learns)
    seen, snapshot = [], sim.decider.snapshot

    def spy(views, *args, **kw):   # the handoffs bound for each decode worker, as the decisions saw them
        seen.extend(v.incoming for v in views if v.incoming)
        return snapshot(views, *args, **kw)

    sim.decider.snapshot = spy
    recs = sim.run(sessions())
    assert seen and all(at >= 0 and load > 0 for inc in seen for at, load in inc)
    assert sim.bound.bound == {}     # every handoff landed (or was abandoned): none left bound
    assert len(recs) == 68 and all(r.ok for r in recs)
    paths = Counter((r.turn == 1, r.route["path"]) for r in recs)
    assert set(p for _, p in paths) <= {"local", "warm", "cold"}
    assert paths[(True, "local")] >= 1 and paths[(True, "cold")] >= 1     # turn 1 local and remote both
    for r in recs:
        assert set(ROUTE_KEYS) - {"server_timing"} <= set(r.route)   # the simulator has no Server-Timing
        assert r.route["predicted_ttft_s"] > 0 and r.route["predicted_tpot_s"] > 0
        assert r.route["path"] in ("local", "warm", "cold")
    # the online correction saw every decode worker's measured TPOT
    assert set(sim.decider.model.tpot_scale) == {"decode-0", "decode-1"}
    assert len(sim.decider.model.tpot_errors) == sum(1 for r in recs if r.output_tokens > 1)
    # and the answers' own timings (as a vLLM worker reports them) taught it each decode worker's steps
    assert all(sim.decider.model.workers[w].decode.samples > 0 for w in ("decode-0", "decode-1"))
    assert not sim._by_seq and sim.admission.in_flight == 0


def test_goodput_is_deterministic():
    make = lambda n, seed: coding_agent(n, seed, context=1024, doc_tokens=4096)  # noqa: E731
    a = simulate_rate(setup(), make, 2.0, 10.0, Target.parse("warm.ttft_p90=2"), seed=1)
    b = simulate_rate(setup(), make, 2.0, 10.0, Target.parse("warm.ttft_p90=2"), seed=1)
    assert a["classes"] == b["classes"] and a["sim"]["events"] == b["sim"]["events"]


def test_the_map_builds_goodput_on_cpds_workers():
    t = cpd_topology("2P1D", "goodput")
    assert (t.policy, t.workers) == ("goodput", {"pre-prefill": 1, "prefill": 1, "decode": 4})


def test_the_map_builds_goodput_replica_as_a_cold_tier_beside_tp4_replicas():
    t = cpd_topology("2P1D", "goodput-replica")
    assert (t.policy, t.workers) == ("goodput", {"pre-prefill": 1, "replica": 2})
    assert cpd_topology("2P2D", "goodput-replica").workers == {"pre-prefill": 1, "replica": 3}
    s = arm_setup("2P1D", "goodput-replica", None, None)
    assert s.tp == {"prefill": 4, "pre-prefill": 4, "replica": 4} and s.gpus == 12


def test_a_warm_turn_that_would_make_three_decodes_waits_for_the_first_answer():
    """The simulated 1P1D pair of ``ranking52`` (its calibration; 0.1 sessions/s, seed 12): three
    warm turns come within 0.3 s to the one decode worker, where two decode within the 43.3 ms
    bound and three do not (52 ms a step). Sent at once all three missed it (45-48 ms); now the
    later two are held (0.8-0.9 s, their TTFT still within 2 s) until the decodes ahead end, and
    every turn of the run decodes within the bound (34 ms at most)."""
    import json
    from dataclasses import replace as copy
    from pathlib import Path

    from benchmarks.policies.ranking import ARMS, joint_target
    from benchmarks.policies.ranking_sim import cpu_setup
    from benchmarks.sim_accuracy.sim_validation import primes
    from warmpath.bench.arrivals import session_seed
    from benchmarks.common.workload import agent

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "ranking52"
    meta = json.loads((root / "ranking.json").read_text())
    target = joint_target(meta["unloaded_tpot_s"])
    s = copy(cpu_setup(root / "calibration.json", meta["timeout_s"], meta["sim_decode_factor"]),
             topology=ARMS["goodput-1p1d"], target=target)
    sim = build(s)
    sim.run(primes())
    seen = len(sim.records)
    start, times = sim.now + 1.0, arrival_times(ArrivalConfig(0.1, 90.0, seed=12))
    ss = agent(len(times), session_seed(12, 0.1))
    for x, t in zip(ss, times):
        x.start = start + t
    recs = sim.run(ss)[seen:]
    held = [r for r in recs if r.route["server_timing"]["route"] > 0.05]
    assert len(recs) == 21 and all(r.ok for r in recs)
    assert len(held) >= 2 and all(r.cls == "warm" and r.ttft < 2.0 for r in held)
    assert max(r.tpot for r in recs) < 0.0433
    assert not sim._held and not sim._hop.get("decode-0") and sim.admission.in_flight == 0

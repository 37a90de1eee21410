"""The simulator: exact hand-worked timelines, determinism, conservation, integrity, and
that it runs the production classes (not forks of them)."""

import dataclasses
import inspect
import pkgutil

import pytest

import warmpath.sim
from warmpath.bench.workload import Session, Turn, coding_agent, long_conversations
from warmpath.launch.topology import Topology, resolve
from warmpath.engine.block_manager import BlockManager
from warmpath.engine.scheduler import Scheduler, SchedulerConfig
from warmpath.kv.block_codec import header_size
from warmpath.kv.block_pool import BlockPool
from warmpath.routing.admission import Admission, AdmissionConfig
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.route import RouteDecider
from warmpath.routing.policy import CPDPolicy, RoutingPolicy
from warmpath.routing.sessions import SessionTable
from warmpath.sim.hardware import HARDWARE, MODELS, HardwareProfile
from warmpath.sim.model_profile import from_config
from warmpath.sim.run import SimSetup, build, simulate_rate
from warmpath.sim.step_time import Roofline, StepTime

TINY = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 128, "intermediate_size": 4096, "vocab_size": 1000, "tie_word_embeddings": False}
FAST = HardwareProfile("test", 1e15, 1e13, 1e12, 1e15, 1e15, 80, net_latency_s=0.0)
# 64 tokens of Llama-3.1-8B KV as the store holds them: 4 blocks of 16, each behind its header
STORED_64 = 4 * (16 * MODELS["llama-3.1-8b"].kv_bytes_per_token + header_size(16))


class Constant(StepTime):
    """Every step takes ``dt`` seconds, whatever it computes."""

    def __init__(self, dt: float) -> None:
        self.dt = dt

    def step_s(self, items):
        return self.dt

    def prefill_tok_s(self):
        return 1e4


def setup(topology, dt=0.1, **kw):
    return SimSetup(topology, MODELS["llama-3.1-8b"], FAST, step_time=Constant(dt), kv_blocks=4096,
                    scheduler=SchedulerConfig(max_num_batched_tokens=512, max_model_len=1 << 16), **kw)


def one_turn(sid, start, n=32, out=4, seed=0):
    return Session(sid, [Turn(list(range(1000 + seed, 1000 + seed + n)), out)], start=start)


def run(s: SimSetup, sessions):
    sim = build(s)
    return sim, sorted(sim.run(sessions), key=lambda r: r.sid)


def test_hand_worked_replica_timeline():
    """One worker, 0.1 s per step, 32-token prompts, 4 tokens out. a and b arrive at 0 and
    share the first step; c arrives at 0.05, joins the second step (decode-first: a and b
    decode, c prefills), so it sees its first token at 0.2 and its last at 0.5."""
    topo = Topology("one", "replica", {"replica": 1})
    sim, recs = run(setup(topo), [one_turn("a", 0.0), one_turn("b", 0.0, seed=100), one_turn("c", 0.05, seed=200)])
    got = {r.sid: (round(r.ttft, 9), round(r.e2e, 9), r.output_tokens) for r in recs}
    assert got == {"a": (0.1, 0.4, 4), "b": (0.1, 0.4, 4), "c": (0.15, 0.45, 4)}
    assert [round(r.tpot, 9) for r in recs] == [0.1, 0.1, 0.1]
    assert sim.workers["replica-0"].steps == 5


def test_hand_worked_disaggregated_timeline():
    """Prefill worker: one 0.1 s step to the first token; handoff through the store (no
    latency on this hardware); the decode worker then takes one step per token."""
    topo = Topology("pd", "pd", {"prefill": 1, "decode": 1})
    sim, recs = run(setup(topo), [one_turn("a", 0.0, n=64)])
    (r,) = recs
    assert (round(r.ttft, 6), round(r.e2e, 6), r.output_tokens) == (0.1, 0.4, 4)
    d = sim.workers["decode-0"]
    # the decode worker found all 4 prompt blocks in L3 and computed only the handed-off token
    assert d.sched.prefix_hit_tokens == 64 and d.cost.decisions["load"] == 1
    assert sim.stats.handoff_bytes == 64 * MODELS["llama-3.1-8b"].kv_bytes_per_token


@pytest.mark.parametrize("topology, ttft, e2e", [
    (Topology("one", "replica", {"replica": 1}), 0.125, 0.425),
    (Topology("pd", "pd", {"prefill": 1, "decode": 1}), 0.125, 0.425)])
def test_request_overhead_shifts_the_timeline_by_exactly_itself(topology, ttft, e2e):
    """25 ms of router/HTTP time: a replica gets the request 25 ms later; a disaggregated
    request reaches the decode worker 25 ms after its prefill. Both see every token 25 ms later."""
    sim, recs = run(setup(topology, request_overhead_s=0.025), [one_turn("a", 0.0, n=64)])
    (r,) = recs
    assert (round(r.ttft, 6), round(r.e2e, 6), r.output_tokens) == (ttft, e2e, 4)   # + a 1e15 B/s put


@pytest.mark.parametrize("miss, cached", [(0.0, 48), (1.0, 32)])
def test_a_re_tokenized_answer_loses_its_kv(miss, cached):
    """Turn 1: 32 prompt tokens + 17 answer tokens, so 3 full blocks hold KV (the third is the
    answer's first 16). Sent back as the generated ids, turn 2 finds all 3; re-tokenized into
    other ids, only the prompt's 2."""
    topo = Topology("one", "replica", {"replica": 1})
    s = Session("a", [Turn(list(range(1000, 1032)), 17), Turn(list(range(2000, 2016)), 2)])
    sim, recs = run(setup(topo, retokenize_miss=miss), [s])
    assert [(r.turn, r.prompt_tokens, r.cached_tokens) for r in recs] == [(1, 32, 0), (2, 65, cached)]


class SlowPrefill(Constant):
    """As :class:`Constant`, but recomputing a prefix looks slow: loading it wins."""

    def prefill_tok_s(self):
        return 100.0


@pytest.mark.parametrize("transfer_cpu, ttft, e2e", [(0.0, 0.2, 0.6), (1.0, 0.3, 0.8)])
def test_transfers_on_shared_cores(transfer_cpu, ttft, e2e):
    """One core; a link that moves the 4 prompt blocks as stored (8 MiB of KV + 4 × 256 B of
    headers, STORED_64) in 0.1 s. Prefill step 0.1 s,
    then its write-through put 0.1 s; the decode worker's first step loads the 4 blocks (0.1 s)
    and computes (0.1 s), then two more steps. With the store's side of each transfer busy on
    the same core (transfer_cpu=1), each transfer takes twice as long."""
    hw = dataclasses.replace(FAST, nic_bytes_s=STORED_64 / 0.1)
    s = SimSetup(Topology("pd", "pd", {"prefill": 1, "decode": 1}), MODELS["llama-3.1-8b"], hw,
                 step_time=SlowPrefill(0.1), kv_blocks=4096, cpu_cores=1, transfer_cpu=transfer_cpu,
                 scheduler=SchedulerConfig(max_num_batched_tokens=512, max_model_len=1 << 16))
    sim, recs = run(s, [one_turn("a", 0.0, n=64)])
    (r,) = recs
    assert (round(r.ttft, 9), round(r.e2e, 9), r.output_tokens) == (ttft, e2e, 4)
    assert sim.workers["decode-0"].cost.decisions["load"] == 1


def test_slower_l3_writes():
    """The same handoff with puts at half the read speed plus 50 ms per put: the prefill
    worker's write-through takes 0.05 + 0.2 s before the first token; the decode worker's
    read still takes 0.1 s."""
    nic = STORED_64 / 0.1
    hw = dataclasses.replace(FAST, nic_bytes_s=nic, l3_write_bytes_s=nic / 2, l3_write_latency_s=0.05)
    s = SimSetup(Topology("pd", "pd", {"prefill": 1, "decode": 1}), MODELS["llama-3.1-8b"], hw,
                 step_time=SlowPrefill(0.1), kv_blocks=4096,
                 scheduler=SchedulerConfig(max_num_batched_tokens=512, max_model_len=1 << 16))
    _, recs = run(s, [one_turn("a", 0.0, n=64)])
    (r,) = recs
    assert (round(r.ttft, 9), round(r.e2e, 9)) == (0.35, 0.75)


def test_ppd_x1_keeps_follow_ups_on_the_decode_worker():
    topo = resolve("ppd-1p3d", "x1")
    sess = long_conversations(3, seed=1, turns=3, first=256, follow=16, answer=8)
    for i, s in enumerate(sess):
        s.start = i * 0.01
    sim, recs = run(setup(topo, dt=0.01), sess)
    assert len(recs) == 9 and all(r.ok for r in recs)
    assert (sim.stats.ppd_local, sim.stats.ppd_remote) == (6, 0)
    assert sim.stats.routed["prefill-0"] == 3          # only the first turns


def test_determinism_conservation_and_integrity():
    s = SimSetup(resolve("cpd-2d"), MODELS["llama-3.1-8b"], HARDWARE["b200"],
                 tp={"pre-prefill": 4, "prefill": 4}, admission=AdmissionConfig(4, {"cold": 2, "warm": 2}))
    make = lambda n, seed: coding_agent(n, seed, context=1024, doc_tokens=1024)  # noqa: E731
    a = simulate_rate(s, make, 8.0, 20.0, {}, seed=3)
    b = simulate_rate(s, make, 8.0, 20.0, {}, seed=3)
    assert a["classes"] == b["classes"] and a["sim"]["events"] == b["sim"]["events"]
    c = simulate_rate(s, make, 8.0, 20.0, {}, seed=4)
    assert c["classes"] != a["classes"]
    # conservation: every turn that started is completed or counted as failed (429s here)
    sessions = make(a["sessions"], 3)
    allc = a["classes"]["all"]
    assert allc["failed"] > 0 and "HTTP 429" in a["errors"]
    sim = build(s)
    from warmpath.bench.arrivals import ArrivalConfig, arrival_times
    for ss, t in zip(sessions, arrival_times(ArrivalConfig(8.0, 20.0, seed=3))):
        ss.start = t
    recs = sim.run(sessions)
    assert len(recs) == allc["completed"] + allc["failed"]
    by = {}
    for r in recs:
        by.setdefault(r.sid, []).append(r)
    for ss in sessions:
        rs = by[ss.sid]
        assert [r.turn for r in rs] == list(range(1, len(rs) + 1))   # in order, no gaps
        assert len(rs) == len(ss.turns) or not rs[-1].ok             # all done, or stopped at a failure
    assert not sim._by_seq and not sim._queued and sim.admission.in_flight == 0
    for w in sim.workers.values():
        w.pool.check_integrity()
        assert w.pool.usage == 0 and not w.sched.has_work()


def test_runs_the_production_classes():
    sim = build(SimSetup(resolve("cpd-1d"), MODELS["llama-3.1-8b"], HARDWARE["h100"]))
    w = sim.workers["prefill-0"]
    assert type(w.sched) is Scheduler and type(w.bm) is BlockManager and type(w.pool) is BlockPool
    assert type(sim.decider) is RouteDecider and type(sim.decider.policy) is CPDPolicy
    assert type(sim.admission) is Admission
    assert type(sim.index) is GlobalKVIndex and type(sim.sessions) is SessionTable
    # no module of the simulator defines its own scheduler, block manager, pool or policy
    production = {"Scheduler", "BlockManager", "BlockPool", "Admission", "GlobalKVIndex", "SessionTable",
                  "RouteDecider", "ColdRule"}
    for mod in pkgutil.iter_modules(warmpath.sim.__path__):
        m = __import__(f"warmpath.sim.{mod.name}", fromlist=["x"])
        for name, obj in inspect.getmembers(m, inspect.isclass):
            if obj.__module__ == m.__name__:
                assert name not in production, f"{m.__name__} forks {name}"
                assert not issubclass(obj, (RoutingPolicy, Scheduler, BlockPool, RouteDecider)), f"{m.__name__}.{name}"


def test_roofline_numbers():
    """Hand-worked on a test GPU: a prefill of 100 tokens of the tiny model (tests/sim/
    test_model_profile.py) is memory-bound in both its GEMMs and its attention: its weights and
    KV over HBM·MBU, plus the step's and the sequence's overheads; FP8 weights run their GEMMs at the FP8 peak times fp8_mfu and read
    half the linear bytes; TP2 adds 2 all-reduces per layer."""
    m = from_config(TINY, "tiny")
    hw = HardwareProfile("t", 1e15, 1e12, 1e11, 1e10, 1e10, 80, mfu=0.5, mbu=0.5, step_overhead_s=1e-3,
                         seq_overhead_s=1e-5, fp8_flops=2e15, fp8_mfu=0.25, ar_latency_s=1e-5)
    r1 = Roofline(m, hw, 1)
    assert r1.step_s([(100, 0)]) == pytest.approx((64_913_408 + 2048 * 100) / 5e11 + 1e-3 + 1e-5, rel=1e-12)
    # 20K tokens: compute-bound; linear FLOPs 2·active·20000 + the LM head once, attention 4·L·H·d·n·n/2
    lin, attn = 2 * 30_408_704 * 20000 + 2 * 1000 * 1024, 4 * 2 * 8 * 128 * 20000 * 10000
    assert r1.step_s([(20000, 0)]) == pytest.approx((lin + attn) / 5e14 + 1e-3 + 1e-5, rel=1e-12)
    fp8 = Roofline(m.with_precision("fp8"), hw, 1)
    assert fp8.step_s([(20000, 0)]) == pytest.approx(lin / 5e14 + attn / 5e14 + 1e-3 + 1e-5, rel=1e-12)
    assert fp8.step_s([(1, 0)]) == pytest.approx((34_504_704 + 2048) / 5e11 + 1e-3 + 1e-5, rel=1e-12)
    # TP2: half of each, plus 2 all-reduces per layer of (2·1/2)·activations over NVLink + latency
    r2 = Roofline(m, hw, 2)
    ar = 2 * 2 * (1.0 * 20000 * 1024 * 2 / 1e11 + 1e-5)
    assert r2.step_s([(20000, 0)]) == pytest.approx((lin + attn) / 1e15 + ar + 1e-3 + 1e-5, rel=1e-12)
    # decodes of 3 sequences: weights once, each one's KV, an overhead per sequence
    assert r1.step_s([(1, 10)] * 3) == pytest.approx((64_913_408 + 2048 * 33) / 5e11 + 1e-3 + 3e-5, rel=1e-12)
    # 4,000 decodes at 1,000 of context: the GEMMs are compute-bound and attention reads its KV —
    # one after the other, the two add (one roofline over the step would hide the GEMMs' 0.5 ms)
    big = [(1, 1000)] * 4000
    assert r1.step_s(big) == pytest.approx((2 * 30_408_704 + 2 * 1_024_000) * 4000 / 5e14 + 2048 * 1001 * 4000 / 5e11
                                           + 1e-3 + 4000 * 1e-5, rel=1e-12)
    with pytest.raises(ValueError):
        dataclasses.replace(hw, mfu=0)


def test_the_gpu_profiles_are_spec_sheets_with_the_fitted_fractions():
    from warmpath.sim.hardware import FIT, SPECS, provenance

    for name, hw in HARDWARE.items():
        assert {k: getattr(hw, k) for k in FIT} == FIT and hw.flops == SPECS[name].flops
    assert HARDWARE["h100"].gemm_flops(1) == 1978.9e12 * FIT["fp8_mfu"]
    assert HARDWARE["a100-80g"].gemm_flops(1) == 312e12 * FIT["mfu"]      # no FP8 tensor cores: BF16's
    src = provenance(HARDWARE["h200"])
    assert src["hbm_bytes_s"] == "spec sheet" and src["mbu"] == "fit" and src["seq_overhead_s"] == "fit"


def test_a_step_that_started_alone_slows_when_another_worker_starts():
    """Two replicas on one shared core, 0.1 s per step, one token out (one step each). a
    starts alone at 0; b arrives at 0.05 on the other replica: from then on both advance at
    half speed, so a ends at 0.05 + 2·0.05 = 0.15, when b has done 0.05 s of its work: it
    ends alone at 0.2 (first token 0.15 after it arrived). Without sharing both take 0.1."""
    topo = Topology("two", "replica", {"replica": 2})
    sim, recs = run(setup(topo, cpu_cores=1), [one_turn("a", 0.0, out=1), one_turn("b", 0.05, out=1, seed=100)])
    assert {r.sid: round(r.ttft, 9) for r in recs} == {"a": 0.15, "b": 0.15}
    assert sorted(sim.stats.routed) == ["replica-0", "replica-1"]
    _, alone = run(setup(topo), [one_turn("a", 0.0, out=1), one_turn("b", 0.05, out=1, seed=100)])
    assert [round(r.ttft, 9) for r in alone] == [0.1, 0.1]


def test_step_scatter_is_seeded():
    """Steps scatter by step_cv around the model, the same way for the same seed."""
    topo = Topology("one", "replica", {"replica": 1})
    sessions = lambda: [one_turn(s, 0.3 * i, seed=100 * i) for i, s in enumerate("abcd")]  # noqa: E731
    ttfts = lambda **kw: [r.ttft for r in run(setup(topo, **kw), sessions())[1]]  # noqa: E731
    assert ttfts(step_cv=0.05, seed=1) == ttfts(step_cv=0.05, seed=1)
    assert ttfts(step_cv=0.05, seed=1) != ttfts(step_cv=0.05, seed=2)
    assert ttfts(step_cv=0.05, seed=1) != ttfts() == [pytest.approx(0.1)] * 4


def test_summary_reports_the_shared_cores_busy():
    """One replica on one shared core: the core is busy exactly while the worker steps."""
    topo = Topology("one", "replica", {"replica": 1})
    make = lambda n, seed: [one_turn(f"s{i}", 0.0, seed=100 * i) for i in range(n)]  # noqa: E731
    got = simulate_rate(setup(topo, cpu_cores=1), make, 1.0, 4.0, {}, seed=1)["sim"]
    assert got["worker_busy"]["replica-0"] > 0
    assert got["cpu_cores_busy"] == pytest.approx(got["worker_busy"]["replica-0"])
    assert simulate_rate(setup(topo), make, 1.0, 4.0, {}, seed=1)["sim"]["cpu_cores_busy"] is None


def test_multi_step_scheduling_lets_new_requests_join_only_between_rounds():
    """vLLM 0.6's --num-scheduler-steps k: a request arriving while others decode waits for the
    round of k steps to end. a alone (0.1 s steps, 8 tokens out) starts round 1 at 0; b arrives
    at 0.15 (in step 2): with k = 4 it joins at step 5 (0.4), so its first token is at 0.5;
    with k = 1 at step 3 (0.2), first token at 0.3."""
    topo = Topology("one", "replica", {"replica": 1})
    ss = lambda: [one_turn("a", 0.0, out=8), one_turn("b", 0.15, out=2, seed=100)]  # noqa: E731
    _, rounds = run(setup(topo, multi_step=4), ss())
    _, plain = run(setup(topo), ss())
    assert {r.sid: round(r.ttft, 9) for r in rounds} == {"a": 0.1, "b": round(0.5 - 0.15, 9)}
    assert {r.sid: round(r.ttft, 9) for r in plain} == {"a": 0.1, "b": round(0.3 - 0.15, 9)}

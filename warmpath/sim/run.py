"""Build a simulated cluster from a topology and profiles; sweep rates into the same
``summary.json`` shape as ``warmpath bench`` (pure, no torch)."""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from warmpath.bench.arrivals import ArrivalConfig, arrival_times, session_seed
from warmpath.bench.metrics import ttft_from
from warmpath.bench.replay import TracePoint, replay, sweep_fields
from warmpath.bench.sweep import judge, max_rate_from_sweep, sweep_summary
from warmpath.slo import CLUSTER_TARGET, Target
from warmpath.bench.workload import Session
from warmpath.launch.topology import Topology
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.step_model import StepModel
from warmpath.kv.block_codec import header_size
from warmpath.kv.hashing import KVNamespace
from warmpath.routing.elastic import ElasticConfig
from warmpath.routing.admission import AdmissionConfig
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.flags import make_policy
from warmpath.routing.goodput import HOLD_SHARE, SLACK_SHARE
from warmpath.routing.policy import CPDConfig, RoutingPolicy
from warmpath.routing.ppd import PPDConfig, PPDTable
from warmpath.sim import router_start
from warmpath.sim.engine_defaults import EngineDefaults, calibrated_engine, engine_defaults
from warmpath.sim.simulation import Simulation
from warmpath.sim.handoff import PDHandoff
from warmpath.sim.hardware import HardwareProfile
from warmpath.sim.model_profile import ModelProfile
from warmpath.sim.step_time import Fitted, Jittered, Roofline, StepTime
from warmpath.sim.lease_store import LeaseStore
from warmpath.sim.store import SharedLink, SimStore
from warmpath.sim.worker import SimWorker, SimWorkerConfig

GIB = 1 << 30


@dataclass(frozen=True)
class SimSetup:
    """A cluster to simulate. ``tp``: GPUs per worker instance by role (default 1).
    ``fitted``: step times from ``warmpath calibrate`` instead of the roofline (the CPU).
    ``kv_blocks``: L1 blocks per worker (default: what the GPUs' memory holds after the
    weights, capped at ``max_kv_blocks`` to bound the simulator's memory)."""

    topology: Topology
    model: ModelProfile
    hardware: HardwareProfile
    tp: dict = field(default_factory=dict)
    fitted: StepModel | None = None
    block_size: int = 16
    kv_blocks: int | None = None
    max_kv_blocks: int = 65536
    l2_gib: float = 0.0
    l3_gib: float = 4096.0
    l3_eviction: str = "lru"              # "lease": evicted as Mooncake's master does (sim/lease_store.py)
    store_bytes_s: float | None = None
    scheduler: SchedulerConfig | None = None   # None: vLLM's defaults on that GPU (sim/engine_defaults.py)
    admission: AdmissionConfig = AdmissionConfig()
    cpd: CPDConfig = CPDConfig()
    ppd_table: PPDTable | None = None
    elastic: bool | str | ElasticConfig | None = None   # "on"/True (the CPD tiers), "roles", "off"/False, a config; None: auto
    step_time: StepTime | None = None     # overrides both (tests, custom profiles)
    cpu_cores: int | None = None          # CPU profile: workers share this many cores
    request_overhead_s: float = 0.0       # router + HTTP hops on the way to the first token at the client
    retokenize_miss: float = 0.0          # share of answers the client re-tokenizes into other ids
    transfer_cpu: float = 0.0             # with cpu_cores: cores the store's side keeps busy per transfer
    contention: float = 0.0               # with cpu_cores: slowdown per extra core running (shared caches)
    l3_overlap: bool = False              # L3 loads beside the steps (``warmpath worker --kv-l3-overlap on``)
    step_cv: float = 0.0                  # step-to-step variation of step times (seeded, mean 1)
    seed: int = 0                         # of that variation
    max_concurrency: int | None = None    # client-side cap: requests wait in the client, TTFT from send
    handoff: PDHandoff = PDHandoff()      # how a P->D handoff works (warmpath's, or the PPD paper's vLLM)
    timeout_s: float | None = None        # client timeout: no answer within it of the send fails (bench's --timeout)
    target: Target | None = CLUSTER_TARGET   # what the goodput policy keeps requests within (slo.py)
    goodput_local: bool = True            # the routing flags (routing/flags.py), as the router takes them
    slack_share: float = SLACK_SHARE
    hold_share: float = HOLD_SHARE
    elastic_hold_s: float | None = None
    elastic_cooldown_s: float | None = None
    gpu_memory_utilization: float | None = None   # of each GPU's memory, weights and KV (None: the engine's)
    router_steps: str = "auto"            # what the router knows of step times at start (sim/router_start.py)
    multi_step: int = 1                   # steps per scheduling round (vLLM 0.6's --num-scheduler-steps)

    def engine(self) -> EngineDefaults:
        """The workers' engine: vLLM's defaults on the GPU (the calibrated engine's on a CPU profile)."""
        return calibrated_engine({}) if self.fitted is not None else engine_defaults("vllm", self.hardware)

    def sched(self) -> SchedulerConfig:
        """The workers' scheduler limits: ``scheduler``, else the engine's."""
        return self.scheduler or self.engine().scheduler()

    def memory_share(self) -> float:
        """Share of each GPU's memory the weights and KV may take: as set, else the engine's."""
        return self.gpu_memory_utilization or self.engine().gpu_memory_utilization

    @property
    def gpus(self) -> int:
        return sum(n * self.tp.get(r, 1) for r, n in self.topology.workers.items())


def build(s: SimSetup) -> Simulation:
    """Workers (production scheduler + block manager), store, index, policy, PPD switch."""
    m, hw = s.model, s.hardware
    block_bytes = s.block_size * m.kv_bytes_per_token
    link = SharedLink(s.store_bytes_s or hw.nic_bytes_s * s.gpus, hw.net_latency_s)
    if s.l3_eviction not in ("lru", "lease"):
        raise ValueError(f"l3_eviction: lru or lease, got {s.l3_eviction!r}")
    blocks = int(s.l3_gib * GIB // (header_size(s.block_size) + block_bytes))   # as stored
    # the master's random first shard of each eviction pass follows the setup's seed
    store = LeaseStore(blocks, link, _rng=random.Random(f"{s.seed}/l3")) if s.l3_eviction == "lease" \
        else SimStore(blocks, link)
    index = GlobalKVIndex(stale_after_s=float("inf"))
    workers = []
    for wid, role in s.topology.roles():
        tp = s.tp.get(role, 1)
        st = s.step_time or (Fitted(s.fitted) if s.fitted is not None else Roofline(m, hw, tp))
        if s.step_cv:
            st = Jittered(st, s.step_cv, f"{s.seed}/{wid}")
        nblocks = s.kv_blocks or int((hw.hbm_gib * tp * s.memory_share() * GIB - m.weight_bytes)
                                      // block_bytes)
        if nblocks <= 0:
            raise ValueError(f"{m.name} does not fit {tp}x {hw.name} (TP{tp}); raise --tp")
        cfg = SimWorkerConfig(min(nblocks, s.max_kv_blocks), s.block_size, block_bytes,
                              int(s.l2_gib * GIB // block_bytes),
                              "write-back" if role == "replica" else "write-through", s.sched(),
                              hw.nic_bytes_s * tp, hw.dram_bytes_s * tp,
                              hw.l3_write_bytes_s * tp if hw.l3_write_bytes_s else None, hw.l3_write_latency_s,
                              s.l3_overlap, s.multi_step)
        workers.append(SimWorker(wid, role, cfg, st, store, index))
    pol = policy_for(s)
    ns = KVNamespace(model_id=m.name, revision="sim", dtype=f"{8 * (m.kv_dtype_bytes or m.dtype_bytes)}bit", block_size=s.block_size)
    mode = s.topology.ppd
    sim = Simulation(workers, pol, ns, store, index, m.kv_bytes_per_token, hw.nic_bytes_s,
                     s.admission, None if mode == "off" else PPDConfig(mode), s.ppd_table, hw.net_latency_s,
                     s.cpu_cores, s.request_overhead_s, s.retokenize_miss, s.transfer_cpu, s.contention,
                     elastic_config(s, pol),
                     s.max_concurrency, s.handoff, s.timeout_s)
    sim.decider.model.steps = router_steps(s, workers)
    sim.answer_timing = s.fitted is None   # a GPU worker is vLLM's (its relay reports them); the embedded engine's is not
    return sim


def router_steps(s: SimSetup, workers: list[SimWorker]) -> dict:
    """The router's step costs at start (``sim/router_start.py``): none, a calibration of the
    hardware (the decode workers' shape), or each worker's exact steps (unjittered)."""
    knows = router_start.resolve(s.router_steps, s.fitted is not None)
    if knows == "oracle":
        return {w.wid: w.st.inner if isinstance(w.st, Jittered) else w.st for w in workers}
    if knows == "learn":
        return {}
    if s.fitted is not None:
        return {None: s.fitted}
    if s.step_time is not None:
        return {None: router_start.calibration_of(s.step_time)}
    role = "decode" if "decode" in s.topology.workers else next(iter(s.topology.workers))
    return {None: _calibration(s.model, s.hardware, s.tp.get(role, 1))}


@functools.lru_cache(maxsize=32)
def _calibration(model: ModelProfile, hw: HardwareProfile, tp: int):
    return router_start.calibration_of(Roofline(model, hw, tp))


def elastic_config(s: SimSetup, policy) -> ElasticConfig:
    """The setup's elastic rule, as ``warmpath router --elastic`` builds it (auto: on for cpd)."""
    if isinstance(s.elastic, ElasticConfig):
        return s.elastic
    mode = {None: "auto", True: "on", False: "off"}.get(s.elastic, s.elastic)
    timing = {k: v for k, v in (("hold_s", s.elastic_hold_s), ("cooldown_s", s.elastic_cooldown_s)) if v is not None}
    return ElasticConfig.from_mode(mode, s.topology.policy, policy.roles, policy.computes_anywhere, **timing)


def policy_for(s: SimSetup) -> RoutingPolicy:
    """The topology's routing policy, built as the router builds it (``routing/flags.py``)."""
    return make_policy(s.topology.policy, s.target, s.goodput_local, s.slack_share, s.hold_share, s.cpd)


def simulate_rate(setup: SimSetup, make: Callable[[int, int], list[Session]], rate: float,
                  duration_s: float, slo, ramp_s: float = 0.0, burstiness: float = 1.0,
                  seed: int = 0, fixed_arrivals: bool = False, stop=None,
                  prime: list[Session] | None = None, session_seed: int | None = None) -> dict:
    """One rate point (sessions/s over the whole cluster): the bench's per-rate result.
    ``fixed_arrivals``: the sessions carry their own start times (a trace). ``stop(records)``:
    ends the run early when true (``Simulation.run``); the point then fails its SLO and
    ``sim.stopped_at_s`` says when it stopped. ``prime``: sessions run to the end first
    (e.g. ``benchmarks/policies/real_policies.py``'s priming), outside the statistics; the measured ones
    start 1 s after them. ``session_seed``: the sessions' seed when not ``seed`` (the
    arrivals keep ``seed``; ``sweep`` passes ``bench/arrivals.session_seed`` as ``warmpath bench`` does)."""
    if fixed_arrivals:
        sessions = make(0, seed)
    else:
        times = arrival_times(ArrivalConfig(rate, duration_s, burstiness, ramp_s, seed))
        sessions = make(len(times), seed if session_seed is None else session_seed)
        for sess, t in zip(sessions, times):
            sess.start = t
    sim = build(setup)
    start, seen = 0.0, 0
    if prime:
        sim.run(prime)
        start, seen = sim.now + 1.0, len(sim.records)
        for sess in sessions:
            sess.start += start
    t0 = time.perf_counter()
    records = sim.run(sessions, None if stop is None else (lambda recs: stop(recs[seen:])))[seen:]
    wall = time.perf_counter() - t0
    # to the last request's end: a client timeout's timer or a role change may still fire after it
    ended = max(sim.last_end, start) - start
    makespan = ended if fixed_arrivals else max(ended, ramp_s + duration_s)
    for w in sim.workers.values():
        w.pool.check_integrity()
    got = judge(records, makespan, slo, rate)
    return {**got, "sessions": len(sessions), "tier_hit_ratio": hit_ratio(sim.workers.values()),
            "slo_met": got["slo_met"] and not sim.stopped, "attained": got["attained"] and not sim.stopped,
            "ttft_from": ttft_from(setup.max_concurrency),
            "sim": {"events": sim.stats.events, "wall_s": wall,
                    "events_per_s": sim.stats.events / wall if wall > 0 else None,
                    "requests": len(records), "handoff_bytes": sim.stats.handoff_bytes,
                    "l3_bytes": sim.store.link.bytes_moved if sim.store else 0.0,
                    "l3_refused_blocks": sim.store.refused if sim.store else 0,
                    "ppd_local": sim.stats.ppd_local, "ppd_remote": sim.stats.ppd_remote,
                    "rejected": sim.stats.rejected, "routed": sim.stats.routed,
                    "admission": {k: v for k, v in sim.admission.to_json().items() if k not in ("slots", "reason")},
                    "stopped_at_s": sim.now - start if sim.stopped else None,
                    "worker_busy": {w.wid: w.busy_s / makespan for w in sim.workers.values()},
                    "cpu_cores_busy": sim.cpu.busy_core_s / makespan if sim.cpu and makespan > 0 else None}}


def hit_ratio(workers) -> dict:
    """Prompt tokens found cached over those looked up, prefix hits only (``all_tiers``):
    a decode worker's load of the KV handed off to it is no prefix hit and is reported
    apart (``handoff_loaded_tokens`` of ``handoff_tokens`` handed off)."""
    workers = list(workers)
    q = sum(w.sched.prefix_query_tokens - w.handoff_query_tokens for w in workers)
    hit = sum(w.sched.prefix_hit_tokens - w.handoff_hit_tokens for w in workers)
    return {"all_tiers": hit / q if q else None, "prefix_hit_tokens": hit, "prefix_query_tokens": q,
            "handoff_loaded_tokens": sum(w.handoff_hit_tokens for w in workers),
            "handoff_tokens": sum(w.handoff_query_tokens for w in workers)}


def _summary(setup: SimSetup, runs: dict[float, dict], slo, label: str, workload: str) -> dict:
    return {"target": label, "workload": workload, "gpus": setup.gpus,
            "ttft_from": ttft_from(setup.max_concurrency), "max_concurrency": setup.max_concurrency,
            "timeout_s": setup.timeout_s, **sweep_summary(runs, slo), "max_rate_meeting_slo": max_rate_from_sweep(runs)}


def sweep(setup: SimSetup, make, rates: list[float], duration_s: float, slo, label: str,
          workload: str, ramp_s: float = 0.0, seed: int = 0) -> dict:
    """Every rate; the ``summary.json`` of ``warmpath bench`` (plus a ``sim`` block per run)."""
    runs = {r: simulate_rate(setup, make, r, duration_s, slo, ramp_s, seed=seed, session_seed=session_seed(seed, r))
            for r in rates}
    return _summary(setup, runs, slo, label, workload)


def sweep_trace(setup: SimSetup, trace: list[Session], points: list[TracePoint], duration_s: float | None,
                slo, label: str, workload: str, seed: int = 0) -> dict:
    """A trace replayed whole (or up to the ``duration_s`` cap) at each point
    (``bench/replay.py``, as ``warmpath bench --trace``); ``summary.json`` as :func:`sweep`."""
    runs = {}
    for p in points:
        sessions, fields = replay(trace, p, duration_s)
        runs[p.rate] = {**simulate_rate(setup, lambda n, s, ss=sessions: ss, p.rate, duration_s or 0.0, slo,
                                        seed=seed, fixed_arrivals=True), **fields}
    summ = _summary(setup, runs, slo, label, workload)
    return {**summ, **sweep_fields(trace, runs, summ["max_rate_meeting_slo"])}

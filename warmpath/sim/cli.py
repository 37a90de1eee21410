"""``warmpath sim`` (one simulated topology, rate sweep → summary.json like ``warmpath bench``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from warmpath.bench.cli import add_shared_flags, check_shared_flags, print_summary
from warmpath.bench.replay import load_trace, parse_floats, trace_points
from warmpath.bench.workload import WORKLOADS
from warmpath.launch.topology import TOPOLOGIES, resolve
from warmpath.routing.flags import add_routing_args, admission_from_args, target_of
from warmpath.sim.hardware import HARDWARE, HardwareProfile
from warmpath.sim.profile_flags import add_profile_args, engine_from_args, model_from_args

# The CPU behind ``warmpath calibrate``: only the transfer speeds matter here (measured on this
# machine: L3 reads ~1.0 GB/s through Mooncake over TCP, host copies ~4 GB/s; L3 writes per
# request 5.6 ms + 0.285 GB/s, benchmarks/results/request_overhead.json); step times come from
# the calibration's fitted StepModel.
CPU = HardwareProfile("cpu", 1.85e11, 2e10, 1e9, 1.0e9, 4e9, hbm_gib=24, step_overhead_s=0.0,
                      net_latency_s=1e-3, l3_write_bytes_s=2.85e8, l3_write_latency_s=4.6e-3)
# Router + HTTP hops + stream relay per request on this machine, outside any worker's own time
# (median of benchmarks/results/request_overhead.json: client TTFT - prefill worker seconds).
CPU_REQUEST_OVERHEAD_S = 0.012
# Cores the Mooncake segment holder keeps busy while KV moves (its CPU seconds over the workers'
# KV-tier seconds in the same run): transfers compete with the workers for the shared cores.
CPU_TRANSFER_CORES = 0.49


def add_parser(sub) -> None:
    s = sub.add_parser("sim", help="simulate a topology at cluster scale (same policy code)")
    s.add_argument("--topology", default="cpd-1d", help=" | ".join(TOPOLOGIES) + " | FILE.json")
    add_routing_args(s)
    add_profile_args(s, "b200", cpu=True)
    s.add_argument("--tp", default="", help="GPUs per worker by role, e.g. pre-prefill=4,prefill=4")
    s.add_argument("--calibration", type=Path, help="`warmpath calibrate` output (required for --hardware cpu)")
    s.add_argument("--kv-l3-overlap", default="off", choices=("off", "on"),
                   help="as the workers' --kv-l3-overlap: L3 loads beside the steps")
    s.add_argument("--kv-gib", type=float, default=None, help="L1 KV per worker (default: GPU memory)")
    s.add_argument("--l2-gib", type=float, default=None,
                   help="L2 KV per worker (default: --hardware cpu as the calibration's served engine, else 0)")
    s.add_argument("--cpu-cores", type=int, default=None,
                   help="--hardware cpu: cores the workers share (steps stretch when more run at once; "
                        "default: the calibration's machine)")
    s.add_argument("--request-overhead-s", type=float, default=None,
                   help="router + HTTP time per request before its first token (default: 0.012 s measured "
                        "on this machine for --hardware cpu, else 0)")
    s.add_argument("--retokenize-miss", type=float, default=None,
                   help="share of answers the clients send back as other token ids (re-tokenized text): "
                        "the next turn recomputes them (default: the calibration's measurement, else 0)")
    s.add_argument("--contention", default=None, metavar="timed|served|X",
                   help="--hardware cpu: slowdown of a step per other busy core — the calibration's served "
                        "phase's (its steps over the fit, beside one other worker vs alone: the default where "
                        "measured), its timed figure (a decode batch beside a neighbour computing flat out), "
                        "or a number")
    s.add_argument("--l3-eviction", default="lru", choices=("lru", "lease"),
                   help="how the store evicts: lru, or lease (as Mooncake's master: shard by shard, any block "
                        "not read in the last 10 s)")
    wl = s.add_mutually_exclusive_group(required=True)
    wl.add_argument("--workload", choices=sorted(WORKLOADS))
    wl.add_argument("--trace", type=Path, help="Mooncake JSONL or CSV trace")
    load = s.add_mutually_exclusive_group()
    load.add_argument("--rates", default=None, help="sessions/s, comma-separated (default 1); a trace: requests/s, "
                                                    "its arrival times rescaled to that mean rate")
    load.add_argument("--trace-speed", help="a trace at these multiples of its own rate, e.g. 0.5,1,2,4")
    s.add_argument("--per-gpu", action="store_true", help="rates are per GPU")
    add_shared_flags(s, duration=120.0)
    s.add_argument("--ramp", type=float, default=0.0)
    s.add_argument("--scale", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, default=Path("sim_out"))
    s.set_defaults(fn=main)


def parse_tp(spec: str) -> dict:
    out = {}
    for part in filter(None, spec.split(",")):
        role, sep, n = part.partition("=")
        if not sep or not n.isdigit() or int(n) < 1:
            raise ValueError(f"--tp: expected ROLE=N[,ROLE=N], got {part!r}")
        out[role.strip()] = int(n)
    return out


def _contention(choice: str | None, cal: dict) -> dict:
    """``--contention``: {} (the calibration's own), or {"contention": the chosen figure}."""
    if choice is None:
        return {}
    if choice in ("timed", "served"):
        shapes = ((cal.get("trace_variation") or {}).get("served") or {}).get("contention")   # older calibrations
        got = ((cal.get("contention_measured") or {}).get("contention") if choice == "timed"
               else (cal.get("contention_served") or {}).get("contention", shapes))
        if got is None:
            raise ValueError(f"--contention {choice}: the calibration has no {choice} figure")
        return {"contention": max(0.0, float(got))}
    try:
        x = float(choice)
    except ValueError:
        raise ValueError(f"--contention: timed, served or a number >= 0, got {choice!r}") from None
    if not x >= 0:
        raise ValueError(f"--contention: must be >= 0, got {choice!r}")
    return {"contention": x}


def setup_from_args(a: argparse.Namespace):
    """The :class:`~warmpath.sim.run.SimSetup` the flags describe."""
    from warmpath.engine.step_model import StepModel
    from warmpath.routing.ppd import PPDTable
    from warmpath.sim.run import SimSetup

    GIB = 1 << 30
    topo = resolve(a.topology, a.ppd, a.route_policy)
    fitted = table = None
    variation: dict = {}
    measured: dict = {}
    engine: dict = {}
    if a.calibration is not None:
        try:
            cal = json.loads(a.calibration.read_text())
            fitted, table = StepModel.from_json(cal["step_model"]), PPDTable.from_json(cal["ppd_table"])
            # measured on served traces (`calibrate --from-trace`): steps' scatter and contention
            # (a contention measured below 0 is noise around none)
            variation = {k: max(0.0, float(cal[k])) for k in ("step_cv", "contention") if cal.get(k) is not None}
            measured = {k: float(cal[k]) for k in ("request_overhead_s", "transfer_cpu", "retokenize_miss")
                        if cal.get(k) is not None}
            engine = cal.get("engine") or {}
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"--calibration {a.calibration}: not a `warmpath calibrate` output ({e})") from e
        variation.update(_contention(getattr(a, "contention", None), cal))
    if a.hardware == "cpu" and fitted is None:
        raise ValueError("--hardware cpu needs --calibration (run `warmpath calibrate` first)")
    model = model_from_args(a)
    hw = CPU if a.hardware == "cpu" else HARDWARE[a.hardware]
    cpu = a.hardware == "cpu"
    eng = engine if cpu else {}   # the calibration's served engine: the CPU profile's defaults
    limits = engine_from_args(a, hw, eng if cpu else None)
    block_bytes = 16 * model.kv_bytes_per_token
    kv_blocks = int(a.kv_gib * GIB // block_bytes) if a.kv_gib else eng.get("l1_blocks")
    l2_gib = a.l2_gib if a.l2_gib is not None else eng.get("l2_blocks", 0) * block_bytes / GIB
    cores = a.cpu_cores if a.cpu_cores is not None else eng.get("cores")
    store = {"l3_gib": eng["l3_gib"]} if eng.get("l3_gib") else {}
    overhead = a.request_overhead_s
    if overhead is None:   # measured by the calibration's served phase, else this machine's
        overhead = measured.get("request_overhead_s", CPU_REQUEST_OVERHEAD_S) if cpu else 0.0
    if overhead < 0:
        raise ValueError(f"--request-overhead-s must be >= 0, got {overhead}")
    retok = a.retokenize_miss if a.retokenize_miss is not None else measured.get("retokenize_miss", 0.0)
    if not 0.0 <= retok <= 1.0:
        raise ValueError(f"--retokenize-miss must be in [0, 1], got {retok}")
    return SimSetup(topo, model, hw, parse_tp(a.tp), fitted, kv_blocks=kv_blocks, l2_gib=l2_gib,
                    scheduler=limits.scheduler(), gpu_memory_utilization=limits.gpu_memory_utilization,
                    router_steps=getattr(a, "router_steps", "auto"), admission=admission_from_args(a), ppd_table=table,
                    cpu_cores=cores if cpu else None, request_overhead_s=overhead,
                    retokenize_miss=retok,
                    elastic=a.elastic, target=target_of(a), goodput_local=a.goodput_local == "on",
                    slack_share=a.goodput_slack_share, hold_share=a.goodput_hold_share,
                    elastic_hold_s=a.elastic_hold_s, elastic_cooldown_s=a.elastic_cooldown_s,
                    transfer_cpu=measured.get("transfer_cpu", CPU_TRANSFER_CORES) if cpu else 0.0, seed=a.seed,
                    l3_eviction=getattr(a, "l3_eviction", "lru"), l3_overlap=getattr(a, "kv_l3_overlap", "off") == "on",
                    max_concurrency=getattr(a, "max_concurrency", None), timeout_s=getattr(a, "timeout", None),
                    **(variation if cpu else {}), **store)


def main(a: argparse.Namespace) -> int:
    from warmpath.bench.metrics import parse_slo
    from warmpath.bench.plots import plot_summaries
    from warmpath.bench.report import write_report
    from warmpath.bench.sweep import write_results
    from warmpath.sim.run import sweep, sweep_trace

    check_shared_flags(a)
    setup = setup_from_args(a)
    slo = parse_slo(a.slo)
    mult = setup.gpus if a.per_gpu else 1
    rates = [r * mult for r in parse_floats(a.rates, "--rates") or []]
    label = f"sim:{setup.topology.name}/{a.hardware}/{a.model}"
    t0 = time.perf_counter()
    if a.trace is not None:
        trace = load_trace(a.trace, a.trace_block, a.scale, a.max_output, a.seed)
        points = trace_points(trace, parse_floats(a.trace_speed, "--trace-speed"), rates)
        summary = sweep_trace(setup, trace, points, a.duration, slo, label, str(a.trace), a.seed)
    else:
        gen = WORKLOADS[a.workload]
        summary = sweep(setup, lambda n, seed: gen(n, seed, scale=a.scale), rates or [1.0 * mult],
                        a.duration or 120.0, slo, label, a.workload, a.ramp, a.seed)
    write_results(a.out, summary)
    write_report(a.out, summary, plot_summaries({label: summary}, a.out, gpus=setup.gpus), label)
    print_summary(summary, lambda run: f" | {run['sim']['events']} events, {run['sim']['events_per_s']:.0f} events/s")
    print(f"{setup.gpus} GPUs; wall {time.perf_counter() - t0:.1f} s; wrote {a.out / 'summary.json'}")
    return 0


def bench_sweep(a: argparse.Namespace) -> dict:
    """The same sweep against the simulator (``--sim CONFIG.json``)."""
    from warmpath.bench.cli import workload_factory
    from warmpath.bench.metrics import parse_slo
    from warmpath.sim.run import sweep, sweep_trace

    check_shared_flags(a)
    if a.concurrency:
        raise ValueError("--sim: no closed loop (--concurrency) in the simulator; --max-concurrency caps an open one")
    try:
        conf = json.loads(a.sim.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--sim {a.sim}: expected a JSON object of `warmpath sim` flags ({e})") from e
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    argv = ["sim", "--workload", "coding-agent"]
    for k, v in conf.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    sa = p.parse_args(argv)
    if sa.calibration is not None:
        sa.calibration = Path(sa.calibration)
    sa.max_concurrency = a.max_concurrency or sa.max_concurrency
    sa.timeout = a.timeout   # the bench's client timeout, as it would cut a real request
    sa.slo = getattr(a, "slo", None) or sa.slo   # the goodput policy keeps the bench's target
    setup = setup_from_args(sa)
    make, trace = workload_factory(a)
    rates = parse_floats(a.rates, "--rates") or ([a.rate] if a.rate else None)
    if trace is not None:
        points = trace_points(trace, parse_floats(a.trace_speed, "--trace-speed"), rates)
        return sweep_trace(setup, trace, points, a.duration, parse_slo(a.slo), f"sim:{a.sim}", str(a.trace), a.seed)
    if rates is None:
        raise ValueError("--sim needs --rate or --rates (no closed loop in the simulator)")
    return sweep(setup, make, rates, a.duration or 60.0, parse_slo(a.slo), f"sim:{a.sim}", a.workload, a.ramp,
                 a.seed)

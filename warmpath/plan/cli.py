"""``warmpath plan``: flags, the simulator's evaluator, and the table and plot it writes."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from warmpath.bench.cli import add_shared_flags, check_shared_flags
from warmpath.bench.workload import WORKLOADS
from warmpath.plan.space import KINDS, PD_POLICIES, PLAN_PPD_MODES
from warmpath.routing.flags import add_routing_args
from warmpath.sim.hardware import HARDWARE, provenance
from warmpath.sim.profile_flags import add_profile_args, engine_from_args, model_from_args


def add_parser(sub) -> None:
    s = sub.add_parser("plan", help="search topologies for a GPU budget in the simulator; recommend one")
    s.add_argument("--gpus", type=int, required=True, help="GPU budget")
    s.add_argument("--min-gpus", type=int, default=None, help="also try deployments this small (default: --gpus)")
    add_profile_args(s, "h100", cpu=False)
    wl = s.add_mutually_exclusive_group(required=True)
    wl.add_argument("--workload", choices=sorted(WORKLOADS))
    wl.add_argument("--trace", type=Path, help="Mooncake JSONL or CSV trace")
    s.add_argument("--tp-set", default="1,2,4,8", help="TP degrees per role to try")
    s.add_argument("--kinds", default=",".join(KINDS), help="deployment kinds to try")
    s.add_argument("--ppd-modes", default=",".join(PLAN_PPD_MODES),
                   help="PPD modes on PD splits (only tried when sessions have turns 2+)")
    s.add_argument("--ppd-kinds", default="pd", help="kinds the PPD modes are tried on: pd, cpd (cpd-1d@dynamic)")
    s.add_argument("--pd-policies", default="pd",
                   help=f"routing policies tried on PD splits, among {','.join(PD_POLICIES)} (pd-kv: KV-aware pool)")
    s.add_argument("--grid", default=None,
                   help="ascending loads: a trace: multiples of its own rate (default GPUs/16 x 1,2,4,..,512); "
                        "a workload: sessions/s per GPU (default 0.05,0.1,..,12.8)")
    s.add_argument("--screen-requests", type=int, default=400,
                   help="a trace: screen every candidate on its first N requests (0: no screen)")
    s.add_argument("--screen-duration", type=float, default=30.0,
                   help="a workload: screen every candidate on this many seconds (0: no screen)")
    s.add_argument("--finalists", type=int, default=2, help="best screened candidates run on the whole load")
    s.add_argument("--bisect", type=int, default=2, help="bisection steps past the grid for the finalists")
    s.add_argument("--jobs", type=int, default=1, help="candidates simulated in parallel (processes)")
    s.add_argument("--block-size", type=int, default=128,
                   help="simulated KV block tokens (coarser than the engine's 16 for speed; see docs/sim.md)")
    add_routing_args(s, topology=False, slo_required=True)
    add_shared_flags(s, duration=120.0)
    s.add_argument("--ramp", type=float, default=0.0)
    s.add_argument("--scale", type=float, default=1.0, help="multiply workload / CSV prompt and answer lengths")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, default=Path("plan_out"))
    s.set_defaults(fn=main)


def _ints(spec: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in spec.split(","))
    except ValueError as e:
        raise ValueError(f"{flag}: expected comma-separated integers, got {spec!r}") from e


def build(a: argparse.Namespace):
    """(config, candidates, evaluator, unit) from the flags."""
    from warmpath.bench.metrics import parse_slo
    from warmpath.bench.replay import load_trace, parse_floats
    from warmpath.launch.topology import Topology
    from warmpath.routing.flags import admission_from_args, target_of
    from warmpath.plan.search import PlanConfig
    from warmpath.plan.evaluate import SimEvaluator, fits
    from warmpath.plan.space import candidates
    from warmpath.sim.run import SimSetup

    check_shared_flags(a)
    slo = parse_slo(a.slo)
    if a.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {a.gpus}")
    if a.block_size < 1:
        raise ValueError(f"--block-size must be >= 1, got {a.block_size}")
    grid = parse_floats(a.grid, "--grid") or (
        [a.gpus / 16 * 2 ** i for i in range(10)] if a.trace else [0.05 * 2 ** i for i in range(9)])
    cfg = PlanConfig(a.gpus, tuple(grid), a.min_gpus, _ints(a.tp_set, "--tp-set"), tuple(a.kinds.split(",")),
                     tuple(a.ppd_modes.split(",")), a.screen_requests, a.screen_duration, a.finalists, a.bisect, a.jobs,
                     a.seed, tuple(a.ppd_kinds.split(",")), tuple(a.pd_policies.split(",")))
    hw = HARDWARE[a.hardware]
    limits = engine_from_args(a, hw)
    base = SimSetup(Topology("plan", "replica", {"replica": 1}), model_from_args(a), hw,
                    block_size=a.block_size, admission=admission_from_args(a), scheduler=limits.scheduler(),
                    gpu_memory_utilization=limits.gpu_memory_utilization, router_steps=a.router_steps,
                    max_concurrency=a.max_concurrency, seed=a.seed, timeout_s=a.timeout, target=target_of(a),
                    goodput_local=a.goodput_local == "on", slack_share=a.goodput_slack_share,
                    hold_share=a.goodput_hold_share, elastic=a.elastic, elastic_hold_s=a.elastic_hold_s,
                    elastic_cooldown_s=a.elastic_cooldown_s)
    if a.trace is not None:
        trace = load_trace(a.trace, a.trace_block, a.scale, a.max_output, a.seed)
        ev = SimEvaluator(base, slo, trace=trace, screen_requests=a.screen_requests, seed=a.seed)
        unit = "req/s"
    else:
        gen = WORKLOADS[a.workload]
        ev = SimEvaluator(base, slo, make=lambda n, seed: gen(n, seed, scale=a.scale), duration_s=a.duration or 120.0,
                          ramp_s=a.ramp, screen_duration_s=a.screen_duration, seed=a.seed)
        unit = "sessions/s"
    modes = cfg.ppd_modes if ev.multi_turn else ("off",)
    cands = candidates(cfg.gpus, cfg.tp_set, cfg.kinds, modes, cfg.min_gpus, lambda tp: fits(base, tp),
                       cfg.ppd_kinds, cfg.pd_policies)
    return cfg, cands, ev, unit, modes


def profile_of(setup) -> dict:
    """What the simulated workers are and where each parameter comes from: the GPU's spec sheet,
    the fit on published measurements, the model's config.json, the engine's defaults."""
    hw, m, sc = setup.hardware, setup.model, setup.sched()
    src = provenance(hw)
    frm = {"spec sheet": [f"{k}={getattr(hw, k):.4g}" for k, v in src.items() if v == "spec sheet"],
           "fit": [f"{k}={getattr(hw, k):.4g}" for k, v in src.items() if v == "fit"],
           "config.json": [f"{m.name}: {m.params / 1e9:.2f}B params, {m.weight_bytes / 2**30:.1f} GiB weights, "
                           f"{m.kv_bytes_per_token} KV bytes/token"],
           "engine": [f"max_num_seqs={sc.max_num_seqs}", f"max_num_batched_tokens={sc.max_num_batched_tokens}",
                      f"gpu_memory_utilization={setup.memory_share()}", f"router steps: {setup.router_steps}"]}
    return {"hardware": {k: {"value": getattr(hw, k), "from": v} for k, v in src.items()}, "from": frm}


def main(a: argparse.Namespace) -> int:
    from warmpath.plan.search import plan
    from warmpath.plan.report import write

    t0, c0 = time.perf_counter(), time.process_time()
    cfg, cands, ev, unit, modes = build(a)
    prep, prep_cpu = time.perf_counter() - t0, time.process_time() - c0
    what = f"trace {a.trace} ({len(ev.trace)} requests, {ev.own:.3g} req/s)" if ev.trace else f"workload {a.workload}"
    print(f"warmpath plan: {len(cands)} candidates on {a.gpus}x {a.hardware}, {a.model}, {what}; "
          f"SLO {a.slo}; PPD modes {','.join(modes)}" + ("" if modes == cfg.ppd_modes else " (no turns 2+)"),
          flush=True)
    prof = profile_of(ev.base)
    print("  " + "; ".join(f"{k}: {', '.join(v)}" for k, v in prof["from"].items()), flush=True)
    result = plan(cands, ev, cfg, unit)
    result["profile"] = prof
    result.update(prep_s=prep, prep_cpu_s=prep_cpu, wall_s=time.perf_counter() - t0, unit=f"{unit}/GPU",
                  load=("x the trace's own rate" if ev.trace else "sessions/s per GPU"),
                  config={k: v for k, v in vars(a).items() if k != "fn"})
    write(a.out, result)
    for k in ("recommended", "runner_up"):
        row = next((r for r in result["rows"] if r["candidate"] == result[k]), None)
        print(f"{k.replace('_', '-')}: " + ("none met the SLO at the lowest load" if row is None else
              f"{row['candidate']} ({row['gpus']} GPUs): {row['per_gpu']:.3g} {unit}/GPU sustained "
              f"(load {row['sustained_load']:.3g}, TTFT p90 {row['ttft_p90_s']:.3g} s, TPOT {row['tpot_s']:.3g} s)"
              + (" - met every load of the grid: extend --grid" if row["all_grid_met"] else "")))
    print(f"{result['simulations']} simulations in {result['wall_s']:.0f} s (CPU: {prep_cpu:.0f} s loading, "
          f"{result['search_cpu_s']:.0f} s simulating over {cfg.jobs} job(s)); wrote {a.out}/plan.json, plan.csv, "
          f"plan.md, plan.png")
    return 0

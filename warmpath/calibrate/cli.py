"""``warmpath calibrate``: measure this engine's step times, then (unless ``--no-served``) the
topology it will serve as ``warmpath serve`` starts it — steps under load, their scatter and
contention, the per-request overhead and the store's CPU per transfer — and write the fitted
step model, the PPD table and the simulator's CPU profile (``warmpath sim --hardware cpu``)."""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
from pathlib import Path


def add_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="measure step times; write the step model and PPD table")
    c.add_argument("--model", default="smollm2")
    c.add_argument("--quantization", default="auto", help="as `warmpath serve` (auto: fp16w on CPU)")
    c.add_argument("--out", default="calibration.json")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--quick", action="store_true", help="fewer points and no served phase (a smoke run)")
    c.add_argument("--contexts", default="128,512,1600",
                   help="cached-context lengths to time steps at (cover the workload's: the fit extrapolates)")
    c.add_argument("--from-trace", default=None, metavar="PATH[,PATH]",
                   help="also fit served workloads' steps that ran alone: one run's --step-trace folder (or "
                        "file) per path; also measures how steps vary and slow each other (step_cv, contention)")
    c.add_argument("--no-served", action="store_true", help="skip the served phase (isolated steps only)")
    c.add_argument("--served-topology", default="cpd-1d", help="topology the served phase starts")
    c.add_argument("--served-rates", default="0.1,0.2", help="coding-agent sessions/s of the served load")
    c.add_argument("--served-duration", type=float, default=60.0, help="seconds of load at each served rate")
    c.add_argument("--serve-args", default="", help="extra `warmpath serve` flags for the served phase")
    c.add_argument("--l3-gbps", type=float, default=0.67, help="L3 read bandwidth for the remote path")
    c.add_argument("--network-gbps", type=float, default=1.0, help="P→D handoff bandwidth")
    c.add_argument("--engine", default="warmpath", choices=("warmpath", "vllm"),
                   help="vllm: measure a vLLM server over HTTP (started as `warmpath worker --engine vllm` starts "
                        "it, with --serve-args' worker flags, or the running one at --url); no served phase")
    c.add_argument("--url", default=None, help="--engine vllm: a running vLLM OpenAI server to measure")
    c.add_argument("--tokens", default="32,128,512", help="--engine vllm: new prompt tokens per prefill")
    c.add_argument("--batches", default="1,4,16", help="--engine vllm: decode batch sizes")
    c.add_argument("--decode-tokens", type=int, default=24, help="--engine vllm: tokens each decode request runs")
    c.add_argument("--refit", default=None, metavar="CALIBRATION",
                   help="time nothing: refit an earlier calibrate output's timed steps (its `profile`) with this "
                        "version's fit and write it to --out (the step model and PPD table change; the rest is kept)")
    c.set_defaults(fn=main)


def refit(src: str, out: str, l3_gbps: float, network_gbps: float) -> int:
    """``--refit``: ``src``'s timed steps fitted again (torch-free); everything else kept."""
    from warmpath.calibrate.fit import fitted
    from warmpath.engine.step_model import StepProfile

    try:
        cal = json.loads(Path(src).read_text())
        prof = StepProfile(*([tuple(r) for r in cal["profile"][k]] for k in ("prefill", "decode", "mixed")))
        kvb = int(cal["kv_bytes_per_token"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--refit {src}: not a `warmpath calibrate` output with its timed steps ({e})") from e
    model, fit = fitted(prof, kvb, l3_gbps, network_gbps)
    cal.update(step_model=fit["step_model"], ppd_table=fit["ppd_table"], refit_of=src)
    Path(out).write_text(json.dumps(cal, indent=1))
    print(f"refit {src}: {len(prof.prefill)} prefill, {len(prof.decode)} decode, {len(prof.mixed)} mixed steps; "
          f"mixed: {model.mixed_form}; wrote {out}")
    return 0


def _traced(paths: list[str]):
    """Each step-trace path's steps with their overlaps (``step_trace.overlaps``, read once for
    every use), and the profile of the steps that ran alone in them."""
    from warmpath.engine.step_trace import overlaps, profile_from_trace, read_step_trace

    traced, runs = None, {}
    for src in paths:
        try:
            steps = read_step_trace(Path(src))
            runs[src] = (steps, overlaps(steps))
            prof = profile_from_trace(*runs[src])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--from-trace {src}: not a step trace ({e})") from e
        traced = prof if traced is None else traced.extend(prof)
    if traced is not None and (not traced.prefill or not traced.decode):
        raise ValueError(f"--from-trace {','.join(paths)}: no prefill or no decode steps that ran alone in it")
    return traced, runs


def _served(a: argparse.Namespace, workdir: Path) -> dict:
    from warmpath.calibrate.served import ServedCalibrationConfig, run_served

    try:
        rates = tuple(float(x) for x in a.served_rates.split(","))
    except ValueError as e:
        raise ValueError(f"--served-rates: expected comma-separated sessions/s, got {a.served_rates!r}") from e
    cfg = ServedCalibrationConfig(topology=a.served_topology, serve_args=tuple(shlex.split(a.serve_args)),
                                  rates=rates, duration_s=a.served_duration)
    print(f"served phase: {cfg.topology}, {cfg.sequential} requests one at a time, then "
          f"{', '.join(f'{r:g}' for r in rates)} sessions/s for {cfg.duration_s:g} s each", flush=True)
    return run_served(cfg, workdir, model=a.model)


def _contention(a: argparse.Namespace, lm) -> dict | None:
    """The timed slowdown beside a second worker (``calibrate/contention.py``), where it means
    what the simulator takes it for: one thread per worker, as ``--threads 1`` and the served
    workers run; not in ``--quick``."""
    import torch

    if a.quick or torch.get_num_threads() != 1:
        return None
    from warmpath.calibrate.contention import measure_contention

    return measure_contention(lm, a.model, a.quantization)


def _contention_served(runs: dict, model) -> dict | None:
    """Every traced run's steps (``runs``: source → (steps, overlaps), as :func:`_traced`'s) over
    the fitted model, alone and beside one other worker (``step_trace.contention_over_model``),
    pooled by the steps beside; ``None`` when no run has
    enough of both. The served steps' own figure: in two traced 300-s runs (0.2 and 0.35
    sessions/s) decode steps slowed 1.077× and 1.097× beside one worker, where the timed figure
    (a neighbour computing flat out) said 1.168× (``docs/benchmarks/sim_accuracy.md``)."""
    from warmpath.engine.step_trace import contention_over_model

    got = {src: contention_over_model(steps, model, ov=ov) for src, (steps, ov) in runs.items()}
    parts = [(w["contention"], w["beside"]) for g in got.values() for w in g["workers"].values()]
    n = sum(b for _, b in parts)
    if not n:
        return None
    return {"contention": max(0.0, sum(c * b for c, b in parts) / n), "steps_beside": n, "runs": got}


def main(a: argparse.Namespace) -> int:
    """Profile (and optionally fit a step trace), write the step model and PPD table."""
    if a.refit:
        return refit(a.refit, a.out, a.l3_gbps, a.network_gbps)
    if a.engine == "vllm":
        from warmpath.calibrate.vllm import main as vllm_main

        return vllm_main(a)
    import torch

    from warmpath.bench.workload import coding_agent
    from warmpath.engine.step_timing import answer_roundtrip_miss, profile_engine
    from warmpath.engine.step_trace import trace_variation
    from warmpath.models.loader import load_model

    try:
        contexts = tuple(int(x) for x in a.contexts.split(","))
    except ValueError as e:
        raise ValueError(f"--contexts: expected comma-separated token counts, got {a.contexts!r}") from e
    if not contexts or min(contexts) < 1:
        raise ValueError(f"--contexts: token counts must be >= 1, got {a.contexts!r}")
    traced, runs = _traced(a.from_trace.split(",") if a.from_trace else [])
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model, quantization=a.quantization)
    if a.quick:
        prof = profile_engine(lm, contexts=(64, 256), tokens=(16, 64), batches=(1, 4), decode_steps=3)
    else:
        prof = profile_engine(lm, contexts=contexts)
    measured = _contention(a, lm)
    first_turns = [(s.prefix + s.turns[0].new_tokens)[-96:] for s in coding_agent(24, seed=900_000)]
    out: dict = {"model": lm.model_id, "quantization": a.quantization,
                 "retokenize_miss": answer_roundtrip_miss(lm, first_turns, 64)}
    with tempfile.TemporaryDirectory(prefix="warmpath-calibrate-") as tmp:
        if not (a.quick or a.no_served):
            served = _served(a, Path(tmp))
            more, more_runs = _traced([served.pop("trace")])
            traced = more if traced is None else traced.extend(more)
            runs["served"] = next(iter(more_runs.values()))
            out.update(request_overhead_s=served["request_overhead_s"], transfer_cpu=served["transfer_cpu"],
                       served=served)
    if traced is not None:
        print(f"from the traces: {len(traced.prefill)} prefill, {len(traced.decode)} decode and "
              f"{len(traced.mixed)} mixed steps that ran alone")
        prof = prof.extend(traced)
    from warmpath.calibrate.fit import fitted, print_fit

    kvb = lm.config.kv_bytes_per_token(next(lm.model.parameters()).element_size())
    model, fit = fitted(prof, kvb, a.l3_gbps, a.network_gbps)
    from warmpath.calibrate.served import served_engine_for

    out["engine"] = served_engine_for(a.served_topology, shlex.split(a.serve_args), a.model,
                                      lm.config.max_position_embeddings, kvb)
    out.update(fit)
    if runs:   # how the served steps scatter around the fit, and slow each other (the CPU profile)
        var = {src: trace_variation(steps, ov=ov) for src, (steps, ov) in runs.items()}
        for k in ("step_cv", "contention"):
            got = [v[k] for v in var.values() if v[k] is not None]
            out[k] = statistics.median(got) if got else None
        out["trace_variation"] = var
        print(f"steps around the fit: cv {out['step_cv']}; slowdown beside one other worker: {out['contention']}")
    if measured is not None:   # timed beside a second process: steadier than few same-shape pairs
        out["contention_measured"] = measured
        out["contention"] = measured["contention"]
        print(f"slowdown beside one other worker, timed: {measured['contention']:.3f} "
              f"({measured['alone_s'] * 1e3:.1f} ms alone, {measured['beside_s'] * 1e3:.1f} ms beside)")
    served_c = _contention_served(runs, model)
    if served_c is not None:   # every served step over the fit: what serving costs (the default)
        out["contention_served"] = served_c
        out["contention"] = served_c["contention"]
        print(f"slowdown beside one other worker, served steps over the fit: {served_c['contention']:.3f}")
    Path(a.out).write_text(json.dumps(out, indent=1))
    print_fit(model)
    for k in ("retokenize_miss", "request_overhead_s", "transfer_cpu"):
        if out.get(k) is not None:
            print(f"{k}: {out[k]:.4g}")
    print(f"wrote {a.out} ({len(out['ppd_table'])} PPD cells)")
    return 0


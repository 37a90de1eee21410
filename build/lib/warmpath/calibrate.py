"""``warmpath calibrate``: measure this engine's step times (and, given a server's step trace,
its steps under a served workload) and write the fitted step model and the PPD table that the
router's dynamic mode and the simulator's CPU profile read."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def add_parser(sub) -> None:
    c = sub.add_parser("calibrate", help="measure step times; write the step model and PPD table")
    c.add_argument("--model", default="smollm2")
    c.add_argument("--out", default="calibration.json")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    c.add_argument("--contexts", default="128,512",
                   help="cached-context lengths to time steps at (cover the workload's: the fit extrapolates)")
    c.add_argument("--from-trace", default=None, metavar="PATH[,PATH]",
                   help="also fit served workloads' steps that ran alone: one run's --step-trace folder (or "
                        "file) per path; also measures how steps vary and slow each other (step_cv, contention)")
    c.add_argument("--l3-gbps", type=float, default=0.67, help="L3 read bandwidth for the remote path")
    c.add_argument("--network-gbps", type=float, default=1.0, help="P→D handoff bandwidth")
    c.set_defaults(fn=main)


def main(a: argparse.Namespace) -> int:
    """Profile (and optionally fit a step trace), write the step model and PPD table."""
    import torch

    from warmpath.engine.profile import profile_engine
    from warmpath.engine.step_trace import profile_from_trace, read_step_trace, trace_variation
    from warmpath.models.loader import load_model
    from warmpath.router.ppd import table_from_model

    try:
        contexts = tuple(int(x) for x in a.contexts.split(","))
    except ValueError as e:
        raise ValueError(f"--contexts: expected comma-separated token counts, got {a.contexts!r}") from e
    if not contexts or min(contexts) < 1:
        raise ValueError(f"--contexts: token counts must be >= 1, got {a.contexts!r}")
    traced, runs = None, {}
    for src in (a.from_trace.split(",") if a.from_trace else []):
        try:
            runs[src] = read_step_trace(Path(src))
            prof = profile_from_trace(runs[src])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--from-trace {src}: not a step trace ({e})") from e
        traced = prof if traced is None else traced.extend(prof)
    if traced is not None and (not traced.prefill or not traced.decode):
        raise ValueError(f"--from-trace {a.from_trace}: no prefill or no decode steps that ran alone in it")
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model)
    if a.quick:
        prof = profile_engine(lm, contexts=(64, 256), tokens=(16, 64), batches=(1, 4), decode_steps=3)
    else:
        prof = profile_engine(lm, contexts=contexts)
    if traced is not None:
        print(f"from the trace: {len(traced.prefill)} prefill and {len(traced.decode)} decode steps")
        prof = prof.extend(traced)
    model = prof.fit()
    kvb = lm.config.kv_bytes_per_token(next(lm.model.parameters()).element_size())
    table = table_from_model(model, kvb, a.l3_gbps * 1e9, a.network_gbps * 1e9)
    out = {"model": lm.model_id, "kv_bytes_per_token": kvb, "step_model": model.to_json(),
           "profile": {"prefill": prof.prefill, "decode": prof.decode, "mixed": prof.mixed},
           "ppd_table": table.to_json()}
    if runs:   # how the served steps scatter around the fit, and slow each other (the CPU profile)
        var = {src: trace_variation(steps) for src, steps in runs.items()}
        for k in ("step_cv", "contention"):
            got = [v[k] for v in var.values() if v[k] is not None]
            out[k] = statistics.median(got) if got else None
        out["trace_variation"] = var
        print(f"steps around the fit: cv {out['step_cv']}; slowdown beside one other worker: {out['contention']}")
    Path(a.out).write_text(json.dumps(out, indent=1))
    a0, a1, a2 = model.prefill_coef
    d0, d1, d2 = model.decode_coef
    print(f"prefill: {a0 * 1e3:.2f} ms + {a1 * 1e3:.3f} ms/token + {a2 * 1e6:.4f} us/token/ctx-token")
    print(f"decode:  {d0 * 1e3:.2f} ms + {d1 * 1e3:.3f} ms/seq + {d2 * 1e6:.4f} us/seq/ctx-token")
    print(f"wrote {a.out} ({len(table.cells)} PPD cells)")
    return 0

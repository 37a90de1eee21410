"""Replay published GPU serving measurements in the simulator and report its error on each
published metric (``published_points.json``: every point with its source and quoted row).

How a point is replayed, by its ``mode``:

* ``batch`` — a static batch (TensorRT-LLM 0.9's peak-throughput and batch-1 tables): the
  batch's prompts in one step, then one decode step per output token, each priced by the
  simulator's step time (:class:`~warmpath.sim.step_time.Roofline`); nothing to schedule.
* ``offline`` / ``rate`` — the simulator itself (production scheduler and router over ``dp``
  replicas of ``tp`` GPUs), the engine's scheduler limits from ``sim/engine_defaults.py`` (and
  the server command's ``--num-scheduler-steps``: new requests join every k-th step): all
  prompts at once, or Poisson arrivals at the published rate. ShareGPT lengths are not in the
  sources that ran them: they are drawn log-normal (σ = 1, clipped as the samplers clip) and
  scaled to GPUStack's totals of the same dataset (217.4 prompt / 201.6 answer tokens per request).

Not replayed: MLPerf's Llama-2-70B (no source read gives its mean prompt length) and the
Mixtral rows (``extra_scope``) unless ``--with-extra``. ``--fit`` searches the shared fractions
(``sim/hardware.FIT``) for the lowest median |log error|, coordinate by coordinate, over the
``batch`` points plus the served long-prompt ones (``--fit-on``), and prints them; the table then
uses what it found.

    python -m benchmarks.sim_accuracy.published [--fit] [--out benchmarks/results/sim_published.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

from warmpath.bench.workload import Session, Turn, fast_tokens
from warmpath.launch.topology import Topology
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim.engine_defaults import EngineDefaults, engine_defaults
from warmpath.sim.hardware import FIT, SPECS, with_fit
from warmpath.sim.model_profile import MODELS
from warmpath.sim.run import SimSetup, build
from warmpath.sim.step_time import Roofline

POINTS = Path(__file__).with_name("published_points.json")
GPU = {"a100": "a100-80g"}
SHAREGPT = (217.4, 201.6)       # GPUStack's totals / 1000 prompts of ShareGPT_V3 (published_points.json)
ENGINE = {"vllm": "vllm", "sglang": "sglang", "trtllm": "sglang"}   # a TRT-LLM server's scheduler: in-flight, chunked
UNBOUNDED = AdmissionConfig(1 << 20, {"cold": 1 << 20, "warm": 1 << 20})


def replayable(p: dict, extra: bool) -> str | None:
    """Why ``p`` is not replayed, or ``None``."""
    if p["source"].startswith("mlperf"):
        return "mean prompt length not published"
    if "rand128" in p["id"]:
        return "front-end bound: 1,000 prompts of 128 tokens are < 1 s of GPU work in a run of 8-23 s"
    if p.get("extra_scope") and not extra:
        return "extra scope (--with-extra)"
    if p["model"] not in MODELS or GPU.get(p["gpu"], p["gpu"]) not in SPECS:
        return f"no profile for {p['model']} on {p['gpu']}"
    return None


def profile(p: dict, fit: dict | None):
    model = MODELS[p["model"]].with_precision(_prec(p["weights"]), _prec(p.get("kv") or p["weights"]))
    return model, with_fit(SPECS[GPU.get(p["gpu"], p["gpu"])], fit)


def _prec(x: str) -> str:
    return {"fp16": "bf16"}.get(x, x)


def predict_batch(p: dict, fit: dict | None) -> dict:
    """A static batch: one prefill step of the batch's prompts, then a decode step per token."""
    model, hw = profile(p, fit)
    rt = Roofline(model, hw, p["tp"])
    b, i, o = int(p["batch"]), int(p["input_len"]), int(p["output_len"])
    first = rt.step_s([(i, 0)] * b)
    stride = max(1, (o - 1) // 64)   # every stride-th decode step priced, standing for the stride (context grows linearly)
    decode = sum(rt.step_s([(1, i + k)] * b) * min(stride, o - 1 - k) for k in range(1, o, stride))
    return {"ttft_ms": 1e3 * first, "output_tok_s_per_gpu": b * o / (first + decode) / p["gpus"]}


def _lengths(p: dict, key: str, n: int, rng: random.Random, mean: float, lo: int, hi: int) -> list[int]:
    if isinstance(p.get(key), int):
        return [p[key]] * n
    raw = [rng.lognormvariate(0.0, 1.0) for _ in range(n)]
    k = mean / statistics.fmean(raw)
    for _ in range(8):   # scaled, clipped, scaled again until the clipped mean is the published one
        got = [min(hi, max(lo, round(x * k))) for x in raw]
        k *= mean / statistics.fmean(got)
    return got


def sessions(p: dict, seed: int = 0) -> list[Session]:
    """The point's requests: one turn each, no shared prefix; arrivals at 0 or Poisson."""
    n, rng = int(p["num_prompts"]), random.Random(seed)
    ins = _lengths(p, "input_len", n, rng, SHAREGPT[0], 4, 1024)
    outs = _lengths(p, "output_len", n, rng, SHAREGPT[1], 4, 1024)
    t, out = 0.0, []
    for k, (i, o) in enumerate(zip(ins, outs)):
        if p["mode"] == "rate":
            t += rng.expovariate(p["rate"])
        out.append(Session(f"p{k}", [Turn(fast_tokens(rng, i), o)], start=t))
    return out


def engine_of(p: dict, hw) -> EngineDefaults:
    if p["engine"] == "vllm" and p.get("engine_version", "").lstrip("v").startswith("0.6"):
        return engine_defaults("vllm-0.6", hw)
    return engine_defaults(ENGINE[p["engine"]], hw)


def predict_served(p: dict, fit: dict | None) -> dict:
    """The simulator on the point's fleet and requests; the published metrics from its records."""
    model, hw = profile(p, fit)
    eng = engine_of(p, hw)
    cmd = p.get("server_cmd", "").split()
    steps = int(cmd[cmd.index("--num-scheduler-steps") + 1]) if "--num-scheduler-steps" in cmd else 1
    setup = SimSetup(Topology("published", "replica", {"replica": int(p.get("dp", 1))}), model, hw,
                     tp={"replica": int(p["tp"])}, scheduler=eng.scheduler(), admission=UNBOUNDED, multi_step=steps,
                     gpu_memory_utilization=eng.gpu_memory_utilization, l3_gib=0.0, max_kv_blocks=1 << 21)
    sim = build(setup)
    recs = [r for r in sim.run(sessions(p)) if r.ok]
    tpots = [r.tpot for r in recs if r.output_tokens > 1]
    end = sim.last_end
    return {"output_tok_s": sum(r.output_tokens for r in recs) / end, "req_s": len(recs) / end,
            "ttft_median_ms": 1e3 * statistics.median(r.ttft for r in recs),
            "ttft_mean_ms": 1e3 * statistics.fmean(r.ttft for r in recs),
            "tpot_median_ms": 1e3 * statistics.median(tpots), "tpot_mean_ms": 1e3 * statistics.fmean(tpots),
            "e2e_median_ms": 1e3 * statistics.median(r.e2e for r in recs)}


SCORED = ("output_tok_s_per_gpu", "output_tok_s", "ttft_ms", "ttft_median_ms", "tpot_median_ms", "e2e_median_ms")


def evaluate(points: list[dict], fit: dict | None) -> list[dict]:
    """One row per (point, published metric the simulator predicts): published, simulated, error."""
    rows = []
    for p in points:
        got = predict_batch(p, fit) if p["mode"] == "batch" else predict_served(p, fit)
        for k in SCORED:
            if k in p["metrics"] and k in got:
                pub, sim = float(p["metrics"][k]), float(got[k])
                rows.append({"id": p["id"], "source": p["source"], "metric": k, "published": pub,
                             "simulated": round(sim, 3), "error": round(sim / pub - 1, 4)})
    return rows


def score(rows: list[dict]) -> float:
    return statistics.median(abs(math.log1p(r["error"])) for r in rows)


STEPS = {"mfu": (0.3, 0.4, 0.5, 0.6, 0.7, 0.8), "fp8_mfu": (0.3, 0.4, 0.5, 0.6, 0.7),
         "attn_mfu": (0.2, 0.3, 0.4, 0.5, 0.7),
         "mbu": (0.5, 0.6, 0.7, 0.8, 0.9), "ar_latency_s": (8e-6, 2e-5, 4e-5, 8e-5),
         "step_overhead_s": (0.0005, 0.001, 0.002, 0.003, 0.005, 0.008),
         "seq_overhead_s": (0.0, 2e-5, 5e-5, 1e-4), "ar_eff": (0.4, 0.6, 0.8, 1.0)}


def fit_fractions(points: list[dict], rounds: int = 1) -> dict:
    """Coordinate search over ``STEPS`` from ``FIT``: each parameter in turn set to the value of
    its grid with the lowest :func:`score`, ``rounds`` times round."""
    best = dict(FIT)
    for _ in range(rounds):
        for k, grid in STEPS.items():
            scored = {v: score(evaluate(points, {**best, k: v})) for v in grid}
            best[k] = min(scored, key=scored.get)
            print(f"  {k} = {best[k]} (median |log error| {scored[best[k]]:.3f})", flush=True)
    return best


def summary(rows: list[dict]) -> dict:
    errs = [abs(r["error"]) for r in rows]
    by_source = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(abs(r["error"]))
    return {"points": len({r["id"] for r in rows}), "metrics": len(rows),
            "median_abs_error": round(statistics.median(errs), 4), "max_abs_error": round(max(errs), 4),
            "within_20pct": sum(e <= 0.2 for e in errs),
            "by_source": {s: {"n": len(v), "median_abs_error": round(statistics.median(v), 4),
                              "max_abs_error": round(max(v), 4)} for s, v in by_source.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fit", action="store_true", help="fit the shared fractions first (minutes)")
    ap.add_argument("--fit-on", default="batch+long", choices=("batch", "batch+long", "all"),
                    help="points the fit uses: the static batches (seconds a round), plus the served long "
                         "prompts (2K-32K: attention; a minute a round), or all (tens of minutes)")
    ap.add_argument("--with-extra", action="store_true", help="also the Mixtral rows")
    ap.add_argument("--only", default="", help="point ids containing this")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/sim_published.json"))
    a = ap.parse_args(argv)
    data = json.loads(POINTS.read_text())
    skipped = {p["id"]: why for p in data["points"] if (why := replayable(p, a.with_extra))}
    points = [p for p in data["points"] if p["id"] not in skipped and a.only in p["id"]]
    fit = None
    t0 = time.perf_counter()
    if a.fit:
        fit = fit_fractions([p for p in points if a.fit_on == "all" or p["mode"] == "batch"
                             or (a.fit_on == "batch+long" and "rand" in p["id"])])
    rows = evaluate(points, fit)
    for r in rows:
        print(f"{r['id']:44s} {r['metric']:22s} published {r['published']:>10.1f}  sim {r['simulated']:>10.1f}"
              f"  {100 * r['error']:+6.1f}%")
    out = {"fit": fit or dict(FIT), "summary": summary(rows), "rows": rows, "skipped": skipped,
           "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(out["summary"], indent=1))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

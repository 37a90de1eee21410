"""The ``goodput`` predictor of this checkout re-run on the situations of recorded requests: for
each ``requests.jsonl`` row, the decode worker as its router saw it at the row's arrival is
rebuilt from the other rows' timelines (``predict_error.timeline``), the path it took is
predicted again (``routing/predict.py``), and the errors are reported as ``predict_error`` does —
so old real records measure a new predictor on the same situations, the decisions unchanged.

The decode worker at time ``t`` (the router's ``LoadBook`` view): running — the rows decoding
there at ``t`` (a local one from its arrival, it prefills there; a remote one from its first
token); queued prompt tokens — the local rows not at their first token yet, their uncached
tokens; contexts — each running row's prompt and half its answer. Step costs: the calibration's
``StepModel`` with ``--decode-factor`` (default: the ranking's served factor, ``ranking.json``'s
``sim_decode_factor``); κ and ρ learnt online in the order the rows ended (``--kappa online``)
or 1.
A remote row's TTFT is its recorded prediction (the prefill worker's learnt line is not rebuilt).

    python -m benchmarks.policies.predict_replay [DIR ...] [--decode-factor F] [--kappa online|1]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.common.results import read_json, stored
from benchmarks.policies.predict_error import RESULTS, load, measure_item, report, show, stretches, timeline
from warmpath.engine.step_model import StepModel
from warmpath.routing.estimate import Estimate
from warmpath.routing.latency import RouterModel
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.routing.predict import predict_local, predict_remote, step_cost
from warmpath.routing.views import PrefixHit, RequestView, Snapshot, WorkerView

CALIBRATION = Path("benchmarks/results/sim_accuracy/calibration_refit.json")


ENGINE_CHUNK = SchedulerConfig().max_num_batched_tokens   # the served engine's chunk in the replayed runs

def decode_view(rows: list[dict], worker: str, t: float, me: dict) -> WorkerView:
    """``worker`` at ``t`` as the router's load book had it, ``me`` (arriving then) left out."""
    run = [r for r in rows if r is not me and r["decode"] == worker and "arrival_s" in r
           and (r["arrival_s"] if r["path"] == "local" else r["first_s"]) <= t < r["end_s"]]
    queued = sum(r["prompt_tokens"] - r["cached_tokens"] for r in run if r["path"] == "local" and t < r["first_s"])
    ctx = sum(r["prompt_tokens"] + r["output_tokens"] // 2 for r in run)
    return WorkerView(worker, "decode", queued_prefill_tokens=queued, running=len(run), running_tokens=ctx,
                      chunk_tokens=ENGINE_CHUNK)


def replay_point(rows: list[dict], cost: StepModel, kv_bytes: int, online: bool) -> None:
    """Re-predict each row of one rate point (its ``replayed_ttft_s`` / ``replayed_tpot_s``)."""
    model = RouterModel(kv_bytes_per_token=kv_bytes, steps={None: cost})
    timed = sorted((r for r in rows if "arrival_s" in r), key=lambda r: r["arrival_s"])
    ended: list[tuple[float, dict]] = []
    for q in timed:
        if online:
            for e, r in sorted(x for x in ended if x[0] <= q["arrival_s"]):
                model.observe_tpot(r["decode"], r["replayed_tpot_s"], r["tpot_s"], r["replayed_parts"])
                if r["replayed_ttft_parts"] is not None:
                    model.observe_local_ttft(r["decode"], *r["replayed_ttft_parts"], r["ttft_s"])
            ended = [x for x in ended if x[0] > q["arrival_s"]]
        dw = decode_view(timed, q["decode"], q["arrival_s"], q)
        k = model.tpot_scale[q["decode"]].value if q["decode"] in model.tpot_scale else 1.0
        rv = RequestView(q["prompt_tokens"], (), 16, q["sid"], q["turn"], max_tokens=q["output_tokens"])
        if q["path"] == "local":
            sn = Snapshot([dw], {dw.worker_id: PrefixHit(q["cached_tokens"] // 16)}, None, kv_bytes, model=model)
            p = predict_local(dw, rv, sn, step_cost(sn, dw), k=k)
        else:
            pw = WorkerView(q["prefill"] or "prefill-0", "prefill")
            e = Estimate(q["predicted_ttft_s"], q["cached_tokens"], 0.0, 0.0, 0.0, 0.0)
            sn = Snapshot([pw, dw], {}, None, kv_bytes, model=model)
            p = predict_remote(pw, dw, rv, sn, step_cost(sn, dw), e=e, k=k)
        q.update(replayed_ttft_s=p.ttft_s, replayed_tpot_s=p.tpot_s, replayed_parts=p.tpot_parts,
                 replayed_ttft_parts=p.ttft_parts)
        ended.append((q["end_s"], q))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", type=Path)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--calibration", type=Path, default=CALIBRATION)
    p.add_argument("--decode-factor", type=float, help="decodes priced F times the calibration's "
                   "(default: ranking.json's sim_decode_factor)")
    p.add_argument("--kappa", choices=("online", "1"), default="online")
    p.add_argument("--out", type=Path, default=RESULTS / "predict_replay.json")
    a = p.parse_args(argv)
    dirs = a.dirs or sorted(RESULTS.glob("real/goodput-1p1d_s*"))
    if missing := [str(d) for d in dirs if not stored(d / "requests.jsonl")]:
        p.error(f"no requests.jsonl in {missing}")
    cal = json.loads(a.calibration.read_text())
    factor = a.decode_factor or read_json(RESULTS / "ranking.json").get("sim_decode_factor", 1.0)
    if not factor > 0:
        p.error(f"--decode-factor must be > 0, got {factor}")
    cost = replace(StepModel.from_json(cal["step_model"]), decode_factor=factor)
    rows = stretches(timeline([r for d in dirs for r in load(d)], a.duration))
    points: dict = {}
    for r in rows:
        points.setdefault((r["source"], r["seed"], r["rate"]), []).append(r)
    for pts in points.values():
        replay_point(pts, cost, int(cal.get("kv_bytes_per_token", 46080)), a.kappa == "online")
    got = [r for r in rows if "replayed_tpot_s" in r]
    recorded, replayed = report(got), report(got, ttft_key="replayed_ttft_s", tpot_key="replayed_tpot_s",
                                             parts_key="replayed_parts")
    show(recorded, "recorded predictions")
    show(replayed, f"replayed: this checkout's predictor, decodes x{factor:.3f}, kappa {a.kappa}")
    result = {"dirs": [str(d) for d in dirs], "decode_factor": factor, "kappa": a.kappa,
              "recorded": recorded, "replayed": replayed,
              "low_load": {"recorded": measure_item(recorded), "replayed": measure_item(replayed)}}
    print(json.dumps(result["low_load"]))
    a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

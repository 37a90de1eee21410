"""Per-request time outside the engine on this machine: what a request spends in the router,
on HTTP hops and in the stream relay, next to what the prefill worker spends on it.

Starts ``cpd-1d`` as ``benchmarks/policies/real_policies.py`` does (same worker flags, same primed
repository contexts, the same coding-agent workload), then sends its turns **one at a time**
(no queueing anywhere) as streaming ``/v1/completions`` with token-id prompts, like
``warmpath bench``. For each request: the client's TTFT, and the router's ``Server-Timing``
stages (``route``: parse, hash, plan; ``prefill``: the router's round trip to the prefill
worker; ``prefill_worker``: that worker's own queue + compute + write-through time;
``decode_first``: handoff to the decode worker until its first token line is back), and the
CPU seconds every process of the cluster (and the client) spent, next to the workers' engine
busy seconds: what is left is CPU work outside engine steps that competes with them for
the machine's cores (HTTP, the router, the stream relay, Mooncake's TCP transfers).

    overhead = client TTFT - prefill_worker

is fitted as ``fixed + per_token * prompt_tokens`` (least squares) and written with every
row to ``benchmarks/results/request_overhead.json``. The simulator's CPU profile takes its
per-request overheads from this file (``warmpath.sim.cli.cpu_profile``).

    python -m benchmarks.sim_accuracy.request_overhead [--sessions 16] [--out FILE]
    python -m benchmarks.sim_accuracy.request_overhead --rate 0.1 --out FILE   # the same breakdown under load
    python -m benchmarks.sim_accuracy.request_overhead --rate 0.1,0.15,0.25 --step-trace DIR --out FILE
        # the rates one after another on one cluster, as benchmarks/policies/real_policies.py runs them
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from benchmarks.common import workload as real  # the cluster benchmark's workload and worker flags

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.calibrate.served import cpu_seconds, request_once, tier_seconds
from warmpath.bench.prom import sample_value
from warmpath.launch import launcher
from warmpath.launch.topology import resolve
from warmpath.procs import free_port
from warmpath.engine.step_trace import overlap, overlaps, read_step_trace
from warmpath.engine.step_model import StepModel
from warmpath.models.loader import load_tokenizer


ENCODE = functools.partial(load_tokenizer().encode, add_special=False)


async def one(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int, sid: str) -> dict:
    return await request_once(http, url, prompt, max_tokens, sid)


async def session(http, url: str, s, gap: float, rows: list, t_start: float) -> None:
    await asyncio.sleep(max(0.0, t_start + s.start - time.perf_counter()))
    hist = list(s.prefix)
    for i, t in enumerate(s.turns):
        hist += t.new_tokens
        row = await one(http, url, list(hist), t.max_tokens, s.sid)
        row.update(sid=s.sid, turn=i + 1, cls=t.cls)
        hist += ENCODE(row.pop("text"))   # the answer joins the history, as `warmpath bench` does it
        rows.append(row)
        print(f"{s.sid} {t.cls:4s} {row['prompt_tokens']:5d} tok: client TTFT {row['client_ttft_s']:.3f} "
              f"worker {row.get('prefill_worker', 0):.3f} ({row.get('path', row.get('tier'))}, {row['cached_tokens']} cached)", flush=True)
        await asyncio.sleep(gap)


async def drive(c, sessions, rate: float, gap: float, warmup: bool = True) -> tuple[list, dict, dict, float]:
    """Run the sessions (one after another when ``rate`` is 0, else at their start times)."""
    rows: list = []
    async with httpx.AsyncClient(timeout=300) as http:
        if warmup:
            await one(http, c.url, [1, 2, 3, 4], 2, "warmup")
        u0, t0 = usage(c), time.perf_counter()
        if rate == 0:
            for s in sessions:
                s.start = 0.0
                await session(http, c.url, s, gap, rows, t0)
        else:
            await asyncio.gather(*(session(http, c.url, s, 0.0, rows, t0) for s in sessions))
        return rows, u0, usage(c), time.perf_counter() - t0


def busy_s(url: str) -> float:
    """A worker's engine busy seconds (its /metrics)."""
    v = sample_value(httpx.get(url + "/metrics", timeout=10).text, "warmpath_engine_busy_seconds_total")
    if v is not None:
        return v
    raise RuntimeError(f"{url}/metrics has no warmpath_engine_busy_seconds_total")


def usage(c) -> dict[str, float]:
    """CPU seconds per process of the cluster, the client, and the workers' engine busy seconds."""
    pids = {n: p.pid for n, p in c.procs.items()}
    pids.update(mooncake_master=c.service.master_proc.pid, mooncake_holder=c.service.holder_proc.pid)
    out = {f"cpu:{n}": cpu_seconds(pid) for n, pid in pids.items()}
    out["cpu:client"] = time.process_time()
    for w in httpx.get(c.url + "/v1/cluster", timeout=10, headers=c.headers).json()["workers"]:
        out[f"busy:{w['worker_id']}"] = busy_s(w["url"])
    return out


def stretch(steps: dict[str, list[dict]], fitted: StepModel) -> dict:
    """Each worker's steps (``--step-trace``) against the calibrated step model: median of
    compute seconds over predicted alone, by how many other workers were stepping meanwhile
    (time-weighted, rounded), and with / without another worker's KV-tier transfer (L3 loads
    and puts, at the ends of its steps) overlapping the step by more than 10%."""
    busy = overlaps(steps)
    out = {}
    for w, mine in steps.items():
        moving = [(o["t0"], o["t0"] + o.get("tiers_s", 0.0)) for v, ss in steps.items() if v != w for o in ss
                  if o.get("tiers_s", 0.0) > 0.005]
        by: dict[str, dict[str, list]] = {"by_overlap": {}, "by_transfer_overlap": {}}
        for s, k in zip(mine, busy[w]):
            r = (s["exec_s"] / fitted.step_s([tuple(i) for i in s["items"]]), s["exec_s"])
            by["by_overlap"].setdefault(str(round(k)), []).append(r)
            by["by_transfer_overlap"].setdefault("yes" if overlap(s, moving) > 0.1 else "no", []).append(r)
        total = sum(t for _, t in (r for g in by["by_overlap"].values() for r in g))
        out[w] = {kind: {k: {"steps": len(g), "time_share": sum(t for _, t in g) / total,
                             "median_ratio_to_model": statistics.median(x for x, _ in g)}
                         for k, g in sorted(groups.items())} for kind, groups in by.items()}
    return out


def put_fit(rows: list[dict], block_bytes: int = 16 * 46080) -> dict:
    """The prefill worker's L3 write-through per request against the blocks it wrote (the
    prompt's blocks it did not find cached): ``fixed + per_block·blocks``, and the bandwidth."""
    pts = [(r["prompt_tokens"] // 16 - (r["cached_tokens"] or 0) // 16, r["prefill_l3_put"])
           for r in rows if "prefill_l3_put" in r]
    fixed, per_block = fit([b for b, _ in pts], [t for _, t in pts])
    return {"requests": len(pts), "fixed_s": fixed, "per_block_s": per_block,
            "write_bytes_s": block_bytes / per_block if per_block > 0 else None}


def answer_reuse(rows: list[dict], block: int = 16) -> dict:
    """The client sends each answer back re-tokenized from its text (as ``warmpath bench``
    does): how many follow-ups did not reuse the KV of the previous answer's first block."""
    prev, follow, missed = {}, 0, 0
    for r in rows:   # a session's turns are in order
        if r["turn"] > 1 and r["sid"] in prev:
            follow += 1
            missed += (r["cached_tokens"] or 0) < prev[r["sid"]] // block * block + block
        prev[r["sid"]] = r["prompt_tokens"]
    return {"follow_ups": follow, "answer_block_not_reused": missed, "miss_share": missed / follow if follow else None}


def per_rate(rows: list[dict]) -> dict:
    """Client TTFT p50 of one rate point's requests: all, warm, first turns, follow-ups."""
    pick = {"all": lambda x: True, "warm": lambda x: x["cls"] == "warm",
            "turn1": lambda x: x["turn"] == 1, "turn2+": lambda x: x["turn"] > 1}
    return {c: statistics.median(x["client_ttft_s"] for x in rows if ok(x)) for c, ok in pick.items()}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return my - b * mx, b


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234, help="workload seed (not one of the validation runs')")
    p.add_argument("--gap", type=float, default=0.5, help="idle seconds between requests")
    p.add_argument("--rate", default="0",
                   help="> 0: sessions/s with the cluster benchmark's arrivals (its seeds) instead of one at a time; "
                        "several (0.1,0.15,0.25): one after another on one cluster, as benchmarks/policies/real_policies.py runs them "
                        "(then without a warm-up request)")
    p.add_argument("--duration", type=float, default=90.0, help="with --rate: seconds of arrivals")
    p.add_argument("--step-trace", type=Path, default=None, metavar="DIR",
                   help="trace every engine step and compare it with the calibrated model by overlap")
    p.add_argument("--calibration", type=Path, default=Path("benchmarks/results/cluster/calibration_ctx1600.json"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/request_overhead.json"))
    a = p.parse_args()
    if a.step_trace and any(a.step_trace.glob("*.jsonl")):
        p.error(f"--step-trace {a.step_trace}: holds traces already (workers append); give an empty folder")
    trace = ["--step-trace", str(a.step_trace)] if a.step_trace else []
    c = launcher.start(resolve("cpd-1d"), "127.0.0.1", free_port(), real.WORKERS + trace, ["--model", "smollm2"],
                       None, 2.0, 1)
    try:
        rates = [float(x) for x in a.rate.split(",")]
    except ValueError:
        p.error(f"--rate: expected sessions/s (comma-separated), got {a.rate!r}")
    a.rate = rates[0] if len(rates) == 1 else rates
    try:
        real.prime(c.url)
        if rates == [0.0]:
            rows, u0, u1, wall = asyncio.run(drive(c, real.agent(a.sessions, a.seed), 0.0, a.gap))
        else:
            rows, wall = [], 0.0
            for i, r in enumerate(rates):   # the validation workload: real_policies.py's sessions and arrivals
                times = arrival_times(ArrivalConfig(r, a.duration, seed=real.SEED))
                sessions = real.agent(len(times), real.SEED + int(r * 1000))
                for s, t in zip(sessions, times):
                    s.start = t
                got, first, u1, w = asyncio.run(drive(c, sessions, r, 0.0, warmup=len(rates) == 1))
                rows += [{**x, "rate": r} for x in got]
                u0, wall = (first if i == 0 else u0), wall + w
    finally:
        c.stop()
    split = [r for r in rows if "prefill_worker" in r]
    over = [r["client_ttft_s"] - r["prefill_worker"] for r in split]
    fixed, per_token = fit([r["prompt_tokens"] for r in split], over)
    def medians(rs: list[dict]) -> dict:
        if not rs:
            return {}
        m = {k: statistics.median(r[k] for r in rs) for k in ("client_ttft_s", "route", "prefill", "prefill_worker",
                                                               "prefill_queue", "prefill_l3_get", "prefill_l3_put",
                                                               "decode_first")}
        m["prefill_hop"] = statistics.median(r["prefill"] - r["prefill_worker"] for r in rs)
        m["client_residual"] = statistics.median(
            r["client_ttft_s"] - r["route"] - r["prefill"] - r["decode_first"] for r in rs)
        return m

    parts = {"all": medians(split), "warm": medians([r for r in split if r["cls"] == "warm"])}
    spent = {k: u1[k] - u0[k] for k in u0}
    cpu = sum(v for k, v in spent.items() if k.startswith("cpu:"))
    busy = sum(v for k, v in spent.items() if k.startswith("busy:"))
    out = {"command": " ".join(["python", *sys.argv]), "rate": a.rate, "requests": len(split),
           "per_rate": {str(r): per_rate([x for x in rows if x.get("rate") == r])
                        for r in (a.rate if isinstance(a.rate, list) else [])},
           "workload": {"sessions": a.sessions, "seed": a.seed} if a.rate == 0 else
           {"rate": a.rate, "duration": a.duration, "seed": real.SEED},
           "cpu_s": {"wall": wall, "per_process": spent, "total": cpu, "engine_busy": busy,
                     "outside_engine_per_request": (cpu - busy) / len(rows)},
           "overhead_s": {"median": statistics.median(over), "fixed": fixed, "per_token": per_token},
           "median_stage_s": parts,
           "answer_reuse": answer_reuse(rows), "l3_put": put_fit(rows), "rows": rows}
    if a.step_trace:
        fitted = StepModel.from_json(json.loads(a.calibration.read_text())["step_model"])
        steps = read_step_trace(a.step_trace)
        out["steps_by_overlap"] = stretch(steps, fitted)
        tiers = tier_seconds(steps)   # cores the holder keeps busy per second of KV transfer
        out["cpu_s"]["holder_cores_per_transfer"] = spent["cpu:mooncake_holder"] / tiers if tiers > 0 else 0.0
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

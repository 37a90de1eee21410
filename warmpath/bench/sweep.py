"""Rate sweeps, the highest rate meeting the target, goodput, tier hit ratios, and result
files (``summary.json``, ``results.csv``, ``requests.jsonl``)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Awaitable, Callable

from warmpath.bench.arrivals import ArrivalConfig, arrival_times, session_seed
from warmpath.bench.metrics import CLASSES, Record, summarize, ttft_from
from warmpath.bench.requests_log import request_row, write_requests
from warmpath.slo import Target, goodput, highest_met
from warmpath.bench.runner import BenchTarget, Encoder, run
from warmpath.bench.workload import Session

SessionFactory = Callable[[int, int], list[Session]]   # (count, seed) -> sessions


def tier_hit_ratios(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Share of prompt tokens served per tier, from warmpath's /metrics deltas."""
    def d(k: str) -> float:
        return after.get(k, 0.0) - before.get(k, 0.0)

    q = d("warmpath_prefix_cache_query_tokens")
    if q <= 0:
        return {"L1": None, "L2": None, "L3": None}
    l2 = d("warmpath_kv_tier_loaded_tokens_total:L2")
    l3 = d("warmpath_kv_tier_loaded_tokens_total:L3")
    return {"L1": (d("warmpath_prefix_cache_hit_tokens") - l2 - l3) / q, "L2": l2 / q, "L3": l3 / q}


def _progress(label: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        width = 30
        fill = int(width * done / max(total, 1))
        sys.stderr.write(f"\r{label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


async def run_rate(target: BenchTarget, make: SessionFactory, rate: float | None, duration_s: float | None,
                   slo, concurrency: int | None = None, burstiness: float = 1.0,
                   ramp_s: float = 0.0, seed: int = 0, encode: Encoder | None = None,
                   fixed: list[Session] | None = None, quiet: bool = False,
                   max_concurrency: int | None = None) -> dict:
    """One point of a sweep: sessions at ``rate`` (or ``concurrency``), summarized.
    ``fixed``: sessions with their own start times (a trace already rescaled and capped by
    ``replay.rescale``), all sent. ``max_concurrency``: the client-side cap (``run``)."""
    if fixed is not None:
        sessions = fixed
    elif concurrency:
        # a pool the closed loop should not exhaust within duration_s (it stops early if it does)
        sessions = make(max(100, int(concurrency * duration_s * 10)), seed)
    else:
        times = arrival_times(ArrivalConfig(rate, duration_s, burstiness, ramp_s, seed))
        # new prompts at every rate point: a server that ran the previous point still holds its KV
        sessions = make(len(times), session_seed(seed, rate))
        for s, t in zip(sessions, times):
            s.start = t
    before = await target.server_metrics()
    label = f"rate {rate}" if rate else f"concurrency {concurrency}"
    records, wall = await run(target, sessions, concurrency, encode, seed,
                              None if quiet else _progress(label), duration_s if concurrency else None,
                              max_concurrency)
    if concurrency and not quiet:
        sys.stderr.write("\n")
    after = await target.server_metrics()
    return {**judge(records, wall, slo, rate), "sessions": len(sessions),
            "tier_hit_ratio": tier_hit_ratios(before, after), "ttft_from": ttft_from(max_concurrency)}


def judge(records: list[Record], duration_s: float, slo, rate: float | None) -> dict:
    """A rate point's verdicts: per-class ``classes``, ``slo_met`` (``Target.met``),
    ``attained`` (goodput's check), ``offered_rps`` (the rate asked for) beside
    ``achieved_rps`` (requests completed per second), the first errors, and the
    ``requests.jsonl`` rows (``requests``, moved out of ``summary.json`` when written)."""
    target = Target.of(slo)
    classes = summarize(records, duration_s, target)
    return {"classes": classes, "duration_s": duration_s, "offered_rps": rate,
            "achieved_rps": classes["all"]["completed"] / duration_s if duration_s > 0 else 0.0,
            "slo_met": target.met(classes), "attained": target.attained(classes),
            "attainment": classes["all"]["attainment"],
            "errors": sorted({r.error for r in records if r.error})[:5],
            "requests": [request_row(r, rate, target.attains(r)) for r in records]}


def sweep_summary(runs: dict, slo, key=str) -> dict:
    """``summary.json``'s per-rate part: ``slo`` (the target's flat keys, as before),
    ``slo_target`` (its JSON), ``rates``, ``runs``, the ``goodput`` line (``targets.goodput``)
    and ``requests`` (every run's rows; ``write_results`` writes them to ``requests.jsonl``)."""
    target = Target.of(slo)
    drop = ("classes", "requests")
    return {"slo": target.flat(), "slo_target": target.to_json(),
            "rates": {key(r): v["classes"] for r, v in runs.items()},
            "runs": {key(r): {k: v for k, v in res.items() if k not in drop} for r, res in runs.items()},
            "goodput": goodput({r: v for r, v in runs.items() if r is not None}),
            "requests": [row for res in runs.values() for row in res.get("requests", [])]}


def max_rate_from_sweep(runs: dict[float, dict], key: str = "slo_met") -> float | None:
    """Highest sustained rate of a sweep: the highest whose run met the SLO (``runs[r][key]``)
    with every lower rate's run meeting it too (a pass above a failure is noise, not capacity)."""
    return highest_met(runs, key)


async def search_max_rate(evaluate: Callable[[float], Awaitable[bool]], lo: float, hi: float,
                          iters: int = 4) -> float | None:
    """Bisection between a rate that meets the SLO (``lo``) and one that does not (``hi``).

    Assumes latency grows with rate. Returns the highest rate found to meet it, ``None``
    if even ``lo`` fails.
    """
    if not await evaluate(lo):
        return None
    if await evaluate(hi):
        return hi
    for _ in range(iters):
        mid = (lo + hi) / 2
        if await evaluate(mid):
            lo = mid
        else:
            hi = mid
    return lo


def write_results(out: Path, summary: dict) -> None:
    """``summary.json`` plus ``results.csv`` (one row per rate × class) and, when the summary
    carries them, ``requests.jsonl`` (one line per request; not repeated in ``summary.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    if "requests" in summary:
        write_requests(out / "requests.jsonl", summary["requests"])
    (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "requests"}, indent=1))
    keys = ["completed", "failed", "timed_out", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_s", "tpot_p50_s", "tpot_p90_s",
            "tpot_p99_s", "itl_s", "e2e_p50_s", "throughput_tok_s", "goodput_rps", "attainment", "success_rate"]
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rate", "class", *keys])
        for rate, classes in summary["rates"].items():
            for c in CLASSES:
                w.writerow([rate, c, *[classes[c].get(k) for k in keys]])


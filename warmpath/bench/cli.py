"""``warmpath bench``: measure an OpenAI-compatible deployment (see ``docs/bench.md``)."""

from __future__ import annotations

import argparse
import asyncio
import functools
from pathlib import Path

from warmpath.bench.metrics import parse_slo
from warmpath.bench.runner import OpenAITarget
from warmpath.bench.sweep import max_rate_from_sweep, run_rate, search_max_rate, write_results
from warmpath.bench.workload import WORKLOADS, csv_trace, mooncake_trace


def add_parser(sub, fn=None) -> None:
    b = sub.add_parser("bench", help="benchmark an OpenAI-compatible endpoint")
    tgt = b.add_mutually_exclusive_group(required=True)
    tgt.add_argument("--url", help="base URL, e.g. http://127.0.0.1:8000")
    b.add_argument("--api-key", default=None,
                     help="for a server started with API keys (default: $WARMPATH_API_KEY's first key)")
    tgt.add_argument("--sim", metavar="CONFIG.json", type=Path,
                     help="benchmark the simulator instead of a server: a JSON object of `warmpath sim` "
                          "flags, e.g. {\"topology\": \"cpd-1d\", \"hardware\": \"b200\", \"tp\": \"prefill=4\"}")
    wl = b.add_mutually_exclusive_group(required=True)
    wl.add_argument("--workload", choices=sorted(WORKLOADS))
    wl.add_argument("--trace", type=Path, help="Mooncake JSONL or CSV (arrival, prompt, output)")
    load = b.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="requests (sessions) per second")
    load.add_argument("--rates", help="comma-separated sweep, e.g. 0.2,0.4,0.8")
    load.add_argument("--concurrency", type=int, help="closed loop with this many sessions in flight")
    b.add_argument("--duration", type=float, default=60.0, help="seconds at each rate (steady phase)")
    b.add_argument("--ramp", type=float, default=0.0, help="seconds of linear ramp before it")
    b.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson)")
    b.add_argument("--slo", help="e.g. ttft_p90=2.0,tpot=0.2")
    b.add_argument("--search", action="store_true", help="bisect for the highest rate meeting the SLO")
    b.add_argument("--timeout", type=float, default=30.0, help="a request failing = no answer within it")
    b.add_argument("--model", default=None, help="model name (default: the server's first)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--scale", type=float, default=1.0, help="multiply prompt/answer lengths (e.g. 0.1 on a CPU)")
    b.add_argument("--time-scale", type=float, default=1.0, help="stretch trace arrival times")
    b.add_argument("--trace-block", type=int, default=512, help="tokens per trace hash_id block")
    b.add_argument("--max-output", type=int, default=None, help="cap output tokens of trace requests")
    b.add_argument("--no-retokenize", action="store_true",
                   help="append same-length filler instead of the re-tokenized answer to histories")
    b.add_argument("--text-prompts", action="store_true",
                   help="send prompts as text (decoded with the SmolLM2 tokenizer) instead of token ids")
    b.add_argument("--out", type=Path, default=Path("bench_out"))
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=fn or main)


def workload_factory(a: argparse.Namespace):
    if a.trace is not None:
        if not a.trace.is_file():
            raise ValueError(f"--trace: file not found: {a.trace}")
        if a.trace.suffix == ".jsonl":
            fixed = mooncake_trace(a.trace, a.trace_block, a.time_scale, max_output=a.max_output)
        else:
            fixed = csv_trace(a.trace, a.seed, a.scale, a.time_scale)
        return None, fixed
    gen = WORKLOADS[a.workload]
    return (lambda n, seed: gen(n, seed, scale=a.scale)), None


async def _bench(a: argparse.Namespace) -> dict:
    slo = parse_slo(a.slo)
    make, fixed = workload_factory(a)
    encode = decode = None
    if not a.no_retokenize or a.text_prompts:
        from warmpath.models.files import load_tokenizer

        tok = load_tokenizer()
        encode = None if a.no_retokenize else functools.partial(tok.encode, add_special=False)
        decode = functools.partial(tok.decode, skip_special=False) if a.text_prompts else None
    import os

    key = a.api_key or (os.environ.get("WARMPATH_API_KEY", "").split(",")[0].strip() or None)
    target = OpenAITarget(a.url, a.model, a.timeout, decode, api_key=key)
    try:
        rates = ([float(x) for x in a.rates.split(",")] if a.rates else
                 [a.rate] if a.rate else [None] if (a.concurrency or fixed is not None) else None)
        if rates is None:
            raise ValueError("give --rate, --rates or --concurrency")
        runs: dict = {}

        async def point(rate):
            return await run_rate(target, make, rate, a.duration, slo, a.concurrency, a.burstiness,
                                  a.ramp, a.seed, encode, fixed, a.quiet)

        for r in rates:
            runs[r] = await point(r)
        summary = {"target": a.url, "workload": a.workload or str(a.trace), "slo": slo,
                   "rates": {str(r if r is not None else f"c{a.concurrency}"): v["classes"] for r, v in runs.items()},
                   "runs": {str(r if r is not None else f"c{a.concurrency}"):
                            {k: v for k, v in res.items() if k != "classes"} for r, res in runs.items()}}
        if a.rates:
            best = max_rate_from_sweep(runs)
            if a.search and slo:
                failing = sorted(r for r, v in runs.items() if not v["slo_met"] and (best is None or r > best))
                if best is not None and failing:
                    async def ok(rate: float) -> bool:
                        res = runs.get(rate) or await point(rate)
                        runs[rate] = res
                        return res["slo_met"]
                    best = await search_max_rate(ok, best, failing[0], iters=3)
            summary["max_rate_meeting_slo"] = best
        return summary
    finally:
        await target.close()


def main(a: argparse.Namespace, sim_sweep=None) -> int:
    """Run the sweep (against the simulator with ``--sim``: ``sim_sweep(a)``), write and print it."""
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    if a.sim and sim_sweep is None:
        raise ValueError("--sim: no simulator given")
    summary = sim_sweep(a) if a.sim else asyncio.run(_bench(a))
    write_results(a.out, summary)
    from warmpath.bench.plots import plot_summaries
    from warmpath.bench.report import write_report

    write_report(a.out, summary, plot_summaries({a.url: summary}, a.out), f"warmpath bench: {a.url}")
    for rate, classes in summary["rates"].items():
        c = classes["all"]
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"rate {rate}: completed {c['completed']} failed {c['failed']} TTFT p50 {fmt(c['ttft_p50_s'])} "
              f"p90 {fmt(c['ttft_p90_s'])} TPOT {fmt(c['tpot_s'])} tok/s {fmt(c['throughput_tok_s'])} "
              f"goodput {fmt(c['goodput_rps'])}")
    if "max_rate_meeting_slo" in summary:
        print(f"max rate meeting SLO: {summary['max_rate_meeting_slo']}")
    print(f"wrote {a.out / 'summary.json'} and {a.out / 'report.html'}")
    return 0

"""``warmpath bench``: measure an OpenAI-compatible deployment (see ``docs/bench.md``)."""

from __future__ import annotations

import argparse
import asyncio
import functools
from pathlib import Path

from warmpath.bench.metrics import parse_slo, ttft_from
from warmpath.bench.replay import TracePoint, load_trace, own_rate, parse_floats, replay, sweep_fields, trace_points
from warmpath.bench.runner import OpenAITarget, timeout_text
from warmpath.bench.sweep import max_rate_from_sweep, run_rate, search_max_rate, sweep_summary, write_results
from warmpath.bench.workload import WORKLOADS


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
    load.add_argument("--rates", help="comma-separated sweep, e.g. 0.2,0.4,0.8 (sessions/s; a trace: "
                                      "requests/s, its arrival times rescaled to that mean rate)")
    load.add_argument("--trace-speed", help="a trace at these multiples of its own rate, e.g. 0.5,1,2,4")
    load.add_argument("--concurrency", type=int, help="closed loop with this many sessions in flight")
    add_shared_flags(b, timeout=None)
    b.add_argument("--ramp", type=float, default=0.0, help="seconds of linear ramp before it (workloads)")
    b.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson)")
    b.add_argument("--slo", help="the target (slo.py), e.g. ttft_p90=2.0,tpot=0.2 or "
                                 "warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.05,attain=0.9")
    b.add_argument("--search", action="store_true", help="bisect for the highest rate meeting the SLO")
    b.add_argument("--model", default=None, help="model name (default: the server's first)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--scale", type=float, default=1.0, help="multiply prompt/answer lengths (e.g. 0.1 on a CPU)")
    b.add_argument("--no-retokenize", action="store_true",
                   help="append same-length filler instead of the re-tokenized answer to histories")
    b.add_argument("--text-prompts", action="store_true",
                   help="send prompts as text (decoded with the SmolLM2 tokenizer) instead of token ids")
    b.add_argument("--out", type=Path, default=Path("bench_out"))
    b.add_argument("--quiet", action="store_true")
    b.set_defaults(fn=fn or main)


SIM_TIMEOUT_S = 30.0   # the simulator's client timeout when none is given (one value for every request)


def add_shared_flags(p: argparse.ArgumentParser, duration: float = 60.0, timeout: float | None = SIM_TIMEOUT_S) -> None:
    """Flags ``warmpath bench`` and ``warmpath sim`` share, meaning the same in both; ``--timeout``'s
    default is ``timeout`` (``None``, the bench's: each request's own, ``runner.DEADLINE``)."""
    p.add_argument("--duration", type=float, default=None,
                   help=f"seconds at each rate (workloads: the steady phase, default {duration:g}); a trace: a cap "
                        "on each replay (arrivals after it are left out and the count printed), default the whole file")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="client-side cap: at most N requests in flight, the others wait in the client and TTFT "
                        "is timed from the send (as vllm bench serve); default: sent on arrival, TTFT from arrival")
    p.add_argument("--trace-block", type=int, default=512, help="tokens per trace hash_id block")
    p.add_argument("--max-output", type=int, default=None, help="cap output tokens of trace requests")
    p.add_argument("--timeout", type=float, default=timeout,
                   help="client timeout (s): a request whose answer has not ended within it of its send fails, "
                        "counted apart as the client's own timeout (default: "
                        + (f"{timeout:g} s)" if timeout is not None else
                           "per request, 30 s + 0.5 s per answer token asked + 0.01 s per prompt token, "
                           "to fit the workload's long answers; with --sim 30 s)"))


def check_shared_flags(a: argparse.Namespace) -> None:
    """The shared flags' errors, the same in bench and sim."""
    if a.max_concurrency is not None and a.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    if a.timeout is not None and not a.timeout > 0:
        raise ValueError(f"--timeout must be > 0, got {a.timeout}")
    if a.trace is not None and a.ramp:
        raise ValueError("--ramp: a trace keeps its own arrivals (pace it with --trace-speed or --rates)")
    if a.trace is None and getattr(a, "trace_speed", None):
        raise ValueError("--trace-speed needs --trace")


def workload_factory(a: argparse.Namespace):
    """(sessions factory, None) for a workload, (None, the trace) for ``--trace``."""
    if a.trace is not None:
        return None, load_trace(a.trace, a.trace_block, a.scale, a.max_output, a.seed)
    gen = WORKLOADS[a.workload]
    return (lambda n, seed: gen(n, seed, scale=a.scale)), None


async def _bench(a: argparse.Namespace) -> dict:
    check_shared_flags(a)
    if a.concurrency and a.max_concurrency:
        raise ValueError("--max-concurrency caps an open loop (--rate / --rates / a trace), not --concurrency")
    slo = parse_slo(a.slo)
    make, trace = workload_factory(a)
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
        rates = parse_floats(a.rates, "--rates") or ([a.rate] if a.rate else None)
        points = {}
        if trace is not None and not a.concurrency:
            points = {p.rate: p for p in trace_points(trace, parse_floats(a.trace_speed, "--trace-speed"), rates)}
            rates = list(points)
        elif rates is None and a.concurrency:
            rates = [None]
        if rates is None:
            raise ValueError("give --rate, --rates or --concurrency")
        runs: dict = {}

        async def point(rate):
            if trace is None:
                return await run_rate(target, make, rate, a.duration or 60.0, slo, a.concurrency, a.burstiness,
                                      a.ramp, a.seed, encode, None, a.quiet, a.max_concurrency)
            # other token ids at every point: the server still holds the previous point's KV
            fresh = trace if not runs else load_trace(a.trace, a.trace_block, a.scale, a.max_output, a.seed,
                                                      salt=len(runs))
            if a.concurrency:   # closed loop over the trace's requests in order
                return await run_rate(target, make, None, a.duration, slo, a.concurrency, seed=a.seed,
                                      encode=encode, fixed=fresh, quiet=a.quiet)
            p = points.get(rate) or TracePoint(rate, rate / own_rate(trace))
            sessions, fields = replay(fresh, p, a.duration)
            res = await run_rate(target, make, rate, a.duration, slo, seed=a.seed, encode=encode, fixed=sessions,
                                 quiet=a.quiet, max_concurrency=a.max_concurrency)
            return {**res, **fields}

        for r in rates:
            runs[r] = await point(r)
        def key_of(r) -> str:
            return str(r if r is not None else f"c{a.concurrency}")

        summary = {"target": a.url, "workload": a.workload or str(a.trace),
                   "ttft_from": ttft_from(a.max_concurrency), "max_concurrency": a.max_concurrency,
                   "timeout_s": a.timeout, "client_timeout": timeout_text(a.timeout),
                   **sweep_summary(runs, slo, key_of)}
        if None not in runs:
            best = max_rate_from_sweep(runs)
            if a.search and not slo.empty:
                failing = sorted(r for r, v in runs.items() if not v["slo_met"] and (best is None or r > best))
                if best is not None and failing:
                    async def ok(rate: float) -> bool:
                        res = runs.get(rate) or await point(rate)
                        runs[rate] = res
                        return res["slo_met"]
                    best = await search_max_rate(ok, best, failing[0], iters=3)
            summary["max_rate_meeting_slo"] = best
            if trace is not None:
                summary.update(sweep_fields(trace, runs, best))
        return summary
    finally:
        await target.close()


def main(a: argparse.Namespace, sim_sweep=None) -> int:
    """Run the sweep (against the simulator with ``--sim``: ``sim_sweep(a)``), write and print it."""
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    if a.sim and sim_sweep is None:
        raise ValueError("--sim: no simulator given")
    if a.sim and a.timeout is None:   # the simulator's client has one timeout for every request
        a.timeout = SIM_TIMEOUT_S
    summary = sim_sweep(a) if a.sim else asyncio.run(_bench(a))
    write_results(a.out, summary)
    from warmpath.bench.plots import plot_summaries
    from warmpath.bench.report import write_report

    write_report(a.out, summary, plot_summaries({a.url: summary}, a.out), f"warmpath bench: {a.url}")
    print_summary(summary)
    print(f"wrote {a.out / 'summary.json'} and {a.out / 'report.html'}")
    return 0


def run(argv: list[str]) -> int:
    """``warmpath bench ARGV`` in this process, against a URL (for code that drives a
    deployment as the command does, e.g. ``calibrate``'s served phase)."""
    p = argparse.ArgumentParser(prog="warmpath")
    add_parser(p.add_subparsers(dest="cmd", required=True))
    return main(p.parse_args(["bench", *argv]))


def print_summary(summary: dict, extra=lambda run: "") -> None:
    """One line per rate (TTFT says what it is timed from; how many failures were the client's
    own timeout), a line saying so when any were, then the highest sustained rate."""
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    frm = summary.get("ttft_from", "arrival")
    for rate, classes in summary["rates"].items():
        c, run = classes["all"], summary["runs"].get(rate, {})
        speed = f" ({run['trace_speed']:g}x trace)" if "trace_speed" in run else ""
        late = f" ({c['timed_out']} at the client's timeout)" if c.get("timed_out") else ""
        print(f"rate {rate}{speed}: completed {c['completed']} failed {c['failed']}{late} TTFT (from {frm}) p50 "
              f"{fmt(c['ttft_p50_s'])} p90 {fmt(c['ttft_p90_s'])} cold p90 {fmt(classes['cold']['ttft_p90_s'])} "
              f"warm p90 {fmt(classes['warm']['ttft_p90_s'])} TPOT {fmt(c['tpot_s'])} "
              f"tok/s {fmt(c['throughput_tok_s'])} goodput {fmt(c['goodput_rps'])}{extra(run)}")
    late = sum(classes["all"].get("timed_out", 0) for classes in summary["rates"].values())
    if late:
        limit = summary.get("client_timeout") or timeout_text(summary.get("timeout_s"))
        print(f"{late} request{'s' if late > 1 else ''} failed at this client's own timeout ({limit}), not with an "
              "error from the server: give --timeout more seconds to let such answers finish")
    g, t = summary.get("goodput"), summary.get("slo_target")
    if g and t and t["classes"]:
        print(f"goodput ({t['attain']:.0%} attain the target): offered {g['offered_rps']} /s, achieved "
              f"{fmt(g['achieved_rps'])} requests/s (attainment {fmt(g['attainment'])})")
    if "max_rate_meeting_slo" in summary:
        speed = summary.get("max_trace_speed_meeting_slo")
        print(f"max sustained rate meeting SLO: {summary['max_rate_meeting_slo']}"
              + (f" ({speed:g}x the trace)" if speed is not None else ""))

"""Soak (issue 17): a cluster under steady load for a long time; nothing may grow, nothing be lost.

Starts ``warmpath serve --topology cpd-1d`` (router, pre-prefill, prefill and decode workers,
Mooncake master and segment holder; serve's default flags plus the address and any
``--serve-arg``), sends the repository contexts once, then runs an open loop of coding-agent
sessions (benchmarks/policies/real_policies.py's workload: 3 shared 1,536-token repository contexts, 75% of
sessions ask 1-3 64-token questions about one of them, 25% are new 2,048-token documents;
32-token answers; Poisson session arrivals, streamed ``/v1/completions``) at ``--rate``
sessions/s for ``--duration`` s, and lets it drain. A sampler thread (benchmarks/reliability/soak_sampler.py)
records every ``--sample-s``: RSS and open fds of every process of the cluster, each worker's
KV blocks per tier, the router's KV index size and session count.

Verdict (benchmarks/reliability/soak_report.py): after the warm-up (``--warmup-frac`` of the run), each
series' mean over the last 20% of the run against its mean over the 20% after the warm-up;
growth above 5% is flagged, with a note when the series is bounded by design. Requests:
sent, completed, failed (answered with an error) and lost (no answer: timed out or cut off);
the goal is 0 lost and nothing growing without a bound. After the drain: every worker idle
with no KV block held by a request, the router with nothing in flight, the same worker PIDs.

Writes ``OUT/<label>.json`` (every sample, drifts, requests, verdict) and ``OUT/<label>.png``;
prints the table; stops every process it started (also on Ctrl-C / SIGTERM).

    python -m benchmarks.reliability.soak                                 # 30 min at 0.175 sessions/s
    python -m benchmarks.reliability.soak --duration 150 --sample-s 5 --label short
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.common.results import read_json
from benchmarks.reliability.cluster_procs import start_time, stop, tree, wait_ready
from benchmarks.reliability.memory import _git
from benchmarks.reliability.soak_load import LOST_HINT, encoder, prime, run_load, sessions
from benchmarks.reliability.soak_report import as_json, drifts, fill_times, idle_fds, plot, table, verdict, without_kv
from benchmarks.reliability.soak_sampler import Sampler, series
from warmpath.launch.topology import resolve
from warmpath.procs import free_port

ROOT = Path(__file__).resolve().parents[2]

SUSTAINED = 0.25   # sessions/s: the highest rate cpd-1d sustained in docs/benchmarks/policies.md (see --help)
RATE_SOURCE = (f"default {0.7 * SUSTAINED:g} sessions/s = 70% of {SUSTAINED:g}, the highest rate cpd-1d "
               "sustained on benchmarks/policies/real_policies.py's coding-agent workload in docs/benchmarks/policies.md ('Cluster: "
               "CPD vs PD' and its rerun 'Real engine, one run': warm TTFT p90 <= 2 s, cold <= 20 s, 99% "
               "succeed), measured with real_policies.py's worker flags (--kv-cache-gib 0.5 --l2-gib 0.5 --threads 1); "
               "here serve runs with its defaults")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of arrivals (default 1800)")
    p.add_argument("--rate", type=float, default=0.7 * SUSTAINED, help=("sessions/s: " + RATE_SOURCE).replace("%", "%%"))
    p.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples (default 10)")
    p.add_argument("--warmup-frac", type=float, default=0.2, help="share of the run before the first "
                   "window (default 0.2; at most 0.6)")
    p.add_argument("--limit", type=float, default=0.05, help="drift beyond which a series is flagged")
    p.add_argument("--seed", type=int, default=0, help="arrivals and prompts")
    p.add_argument("--request-timeout-s", type=float, default=180.0, help="a request not answered by then "
                   "is lost")
    p.add_argument("--topology", default="cpd-1d")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="one more `warmpath serve` argument (repeatable; write --serve-arg=--flag)")
    p.add_argument("--label", default="soak", help="name of the result files")
    p.add_argument("--timeout-s", type=float, default=600.0, help="how long startup may take")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/soak")
    p.add_argument("--reanalyse", type=Path, default=None, metavar="JSON",
                   help="no run: the verdict again from a result file's samples (.json or .json.gz)")
    p.add_argument("--block-bytes", type=int, default=737_280, help="with --reanalyse, for files without "
                   "capacity_bytes: bytes of one KV block (SmolLM2-135M float32, 16 tokens: 737,280)")
    a = p.parse_args(argv)
    if not 0 <= a.warmup_frac <= 0.6:
        p.error("--warmup-frac must be in [0, 0.6] (two windows of 20% follow it)")
    return a


def _sigterm(_signo, _frame) -> None:
    raise KeyboardInterrupt   # the same clean-up as Ctrl-C


def workers(base: str, auth: dict) -> dict[str, dict]:
    """The router's workers by id (URL, PID), as the cluster token sees them."""
    return {w["worker_id"]: w for w in httpx.get(base + "/v1/cluster", timeout=10, headers=auth).json()["workers"]}


def idle_check(row: dict, before: dict, after: dict) -> dict:
    """After the drain: nothing in flight or held by a request anywhere, the same worker PIDs."""
    v = row["values"]
    busy = {k: x for k, x in v.items() if (k.startswith("load/") or k.endswith("/in_use")) and x}
    pids = {w: (before[w]["pid"], after.get(w, {}).get("pid")) for w in before}
    changed = {w: p for w, p in pids.items() if p[0] != p[1]}
    return {"busy": busy, "worker_pids_changed": changed, "ok": not busy and not changed}


def progress(counts: dict):
    """A line per sample: time, requests so far, total RSS."""
    def show(row: dict) -> None:
        rss = sum(x for k, x in row["values"].items() if k.startswith("rss_mib/"))
        print(f"  t={row['t']:7.1f} s  sent {counts['sent']:5d} completed {counts['completed']:5d} failed "
              f"{counts['failed']:3d} lost {counts['lost']:3d}  RSS {rss:8,.0f} MiB  sessions "
              f"{row['values'].get('sessions', 0):.0f}", flush=True)
    return show


def soak(a: argparse.Namespace, argv: list[str], token: str, log: Path) -> dict:
    """Start the cluster, load it while sampling, drain, check it is idle; stop it whatever happens."""
    auth = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    seen: dict[int, int] = {}
    sampler = None
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                env={**os.environ, "WARMPATH_CLUSTER_TOKEN": token})
    try:
        t_start = time.monotonic()
        wait_ready(proc, base, auth, resolve(a.topology).size, a.timeout_s)
        startup = time.monotonic() - t_start
        seen.update((p, start_time(p)) for p in tree(proc.pid))
        ws = workers(base, auth)
        prime(base)
        ss, encode = sessions(a.rate, a.duration, a.seed), encoder()
        counts = {"sent": 0, "completed": 0, "failed": 0, "lost": 0}
        sampler = Sampler(proc.pid, base, auth, {w: r["url"] for w, r in ws.items()}, a.sample_s,
                          time.perf_counter(), progress(counts))
        sampler.start()
        load = asyncio.run(run_load(base, a, ss, encode, counts))
        time.sleep(min(10.0, a.sample_s))      # let heartbeats and events settle
        sampler.halt()
        seen.update((p, start_time(p)) for p in tree(proc.pid))
        last = sampler.sample()
        sampler.rows.append(last)
        idle = idle_check(last, ws, workers(base, auth))
    finally:
        if sampler is not None:
            sampler.close()
        stop(proc, seen)
    return {"startup_s": round(startup, 1), "load": load, "idle_after": idle, "rows": sampler.rows,
            "sampler_errors": sampler.errors[:50], "pids": {k: sorted(v) for k, v in sampler.pids.items()},
            "workers": {w: {"role": r["role"], "pid": r["pid"]} for w, r in ws.items()}}


def report(a: argparse.Namespace, argv: list[str], res: dict) -> dict:
    """Drifts, verdict, the result file, the plot and the printed summary."""
    s = series(res["rows"], until=a.duration)
    s.update(without_kv(s))
    d = drifts(s, a.duration, a.warmup_frac, a.limit)
    req = res["load"]["requests"]
    fds = idle_fds(series(res["rows"]), a.limit)
    v = verdict(d, req, fds)
    v["fds_before_after"] = {k: [b, e] for k, (b, e, _) in fds.items()}
    v["goal_met"] = v["goal_met"] and res["idle_after"]["ok"]
    filled = fill_times(s)
    v["pools_still_filling_after_warmup"] = sorted(k for k, t in filled.items()
                                                  if t is None or t > a.warmup_frac * a.duration)
    out = {"command": " ".join(["python", "benchmarks/reliability/soak.py", *sys.argv[1:]]), "serve": " ".join(argv[3:]),
           "git": _git(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "rate_sessions_s": a.rate,
           "rate_source": RATE_SOURCE, "duration_s": a.duration, "sample_s": a.sample_s,
           "warmup_frac": a.warmup_frac, "limit": a.limit, "seed": a.seed, "verdict": v,
           "drift": as_json(d), "pool_full_at_s": filled, **{k: x for k, x in res.items() if k != "rows"}, "samples": res["rows"]}
    (a.out / f"{a.label}.json").write_text(json.dumps(out, indent=1) + "\n")
    whole = series(res["rows"])
    png = plot(whole | without_kv(whole), a.duration, a.warmup_frac, a.out / f"{a.label}.png",
               f"soak: {a.topology} at {a.rate:g} sessions/s for {a.duration:g} s, sampled every {a.sample_s:g} s")
    print(table(d))
    for k, x in d.items():
        if x.flagged and x.note:
            print(f"  {k}: {x.note}")
    print(f"requests: sent {req['sent']}, completed {req['completed']}, failed {req['failed']} (error answers), "
          f"lost {req['lost']} ({LOST_HINT}); sessions {res['load']['sessions']}")
    lat = res["load"]["latency"]
    print(f"TTFT p50 / p90: warm {lat['warm']}, cold {lat['cold']} s; achieved {res['load']['achieved_rps']:.3f} req/s")
    print(f"after the drain: {'idle, same worker PIDs' if res['idle_after']['ok'] else res['idle_after']}")
    print("KV pools 95% full at: " + ", ".join(f"{k} {'never' if t is None else f'{t:.0f} s'}"
                                               for k, t in filled.items()))
    if v["pools_still_filling_after_warmup"]:
        print(f"  still filling after the warm-up: {', '.join(v['pools_still_filling_after_warmup'])}: those "
              "workers' RSS grows by design while their pool is committed (up to its capacity); a longer "
              "--duration or --warmup-frac moves the windows past it")
    if res["sampler_errors"]:
        print(f"sampler errors: {len(res['sampler_errors'])}, first: {res['sampler_errors'][0]}")
    print(f"verdict: {'GOAL MET' if v['goal_met'] else 'GOAL NOT MET'}: growing without a bound: "
          f"{v['flagged_unbounded'] or 'none'}; descriptors grown at idle: {v['fds_grown_at_idle'] or 'none'}; "
          f"lost {v['lost']}")
    print(f"wrote {a.out / (a.label + '.json')} and {png}")
    return out


def main(argv=None) -> int:
    """Run once and report (see the module docstring)."""
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.reanalyse:        # the verdict again from a run's samples (same flags as the run)
        old = read_json(a.reanalyse)   # plain or gzipped (results/soak/*.json.gz)
        res = {k: v for k, v in old.items() if k in ("startup_s", "load", "idle_after", "sampler_errors", "pids",
                                                     "workers")} | {"rows": old["samples"]}
        for row in res["rows"]:    # runs before the sampler recorded capacity_bytes
            for k in [k for k in row["values"] if k.startswith("capacity/")]:
                row["values"].setdefault("capacity_bytes/" + k.removeprefix("capacity/"),
                                         row["values"][k] * a.block_bytes)
        return 0 if report(a, ["", "", "", *old["serve"].split()], res)["verdict"]["goal_met"] else 1
    signal.signal(signal.SIGTERM, _sigterm)
    cmd = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", a.topology,
           "--host", "127.0.0.1", "--port", str(free_port()), *a.serve_arg]
    print(f"soak: {a.topology} at {a.rate:g} sessions/s for {a.duration:g} s (+ drain), every {a.sample_s:g} s",
          flush=True)
    res = soak(a, cmd, secrets.token_urlsafe(24), a.out / f"{a.label}.log")
    out = report(a, cmd, res)
    return 0 if out["verdict"]["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())

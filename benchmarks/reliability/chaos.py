"""Faults under load (issue 17): a steady coding-agent load on ``cpd-1d`` while a seeded
fault schedule runs (``benchmarks/reliability/chaos_faults.py``), then every answer checked.

Starts ``warmpath serve --topology cpd-1d`` (router, pre-prefill, prefill, decode, private
Mooncake; ``--heartbeat-s`` for every process, the router dropping a silent worker after
``--drop-after-s``) with fault injection on, sends sessions at ``--rate`` per second for
``--duration`` seconds (greedy, streamed, ``chaos_load.py``), fires the faults, waits for
the load to end, then checks: each worker idle with no KV block held and its block pool's
invariants holding (``warmpath_kv_blocks_used``, ``warmpath_kv_pool_integrity``); the
cluster stopped with no process left behind; each completed answer equal to a single
in-process engine's greedy answer (same model, ``--quantization auto``). Prints a summary
and writes ``OUT/chaos.json`` (``OUT/chaos.log``: the cluster's output). Exit 1 if a goal
was missed.

    python -m benchmarks.reliability.chaos [--duration 600] [--rate 0.1] [--seed 0] [--heartbeat-s 1]
                               [--faults kill,stop,store,corrupt,fill] [--out benchmarks/results/chaos]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.reliability.chaos_faults import KINDS, Faults, schedule
from benchmarks.reliability.chaos_load import Load, dump_log, references, tally
from benchmarks.reliability.chaos_report import after_load, goals, print_summary
from benchmarks.reliability.cluster_procs import start_time, stop, tree, wait_ready
from warmpath.procs import free_port

ROOT = Path(__file__).resolve().parents[2]


def members(root: int) -> dict[int, int | None]:
    """``root``'s process tree: pid -> start time (to find leftovers later, not reused PIDs)."""
    return {p: start_time(p) for p in tree(root)}


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (sessions start within it)")
    p.add_argument("--rate", type=float, default=0.1, help="sessions per second (Poisson)")
    p.add_argument("--seed", type=int, default=0, help="seeds the workload and the fault schedule")
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--drop-after-s", type=float, default=None, help="default: 1.5 heartbeats")
    p.add_argument("--faults", default=",".join(KINDS), help=f"a subset of {','.join(KINDS)}")
    p.add_argument("--stop-s", type=float, default=40.0, help="how long a SIGSTOPped worker stays stopped")
    p.add_argument("--scale", type=float, default=0.1, help="coding-agent lengths times this")
    p.add_argument("--l3-gib", type=float, default=0.25)
    p.add_argument("--timeout", type=float, default=120.0, help="a request's own limit (s)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/chaos")
    a = p.parse_args(argv)
    a.faults = [k for k in a.faults.split(",") if k]
    if bad := set(a.faults) - set(KINDS):
        p.error(f"unknown fault kinds {sorted(bad)}")
    a.drop_after_s = a.drop_after_s or 1.5 * a.heartbeat_s
    return a


def start(a: argparse.Namespace, token: str, log: Path) -> tuple[subprocess.Popen, str]:
    """``warmpath serve --topology cpd-1d`` with fault injection (output to ``log``)."""
    port = free_port()
    argv = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", "cpd-1d",
            "--host", "127.0.0.1", "--port", str(port), "--heartbeat-s", str(a.heartbeat_s),
            "--drop-after-s", str(a.drop_after_s), "--kv-cache-gib", "0.05", "--l2-gib", "0.05",
            "--l3-gib", str(a.l3_gib), "--max-model-len", "1024"]
    env = {**os.environ, "WARMPATH_CLUSTER_TOKEN": token, "WARMPATH_FAULT_INJECTION": "1"}
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def run(a: argparse.Namespace, proc: subprocess.Popen, base: str, auth: dict, seen: dict) -> dict:
    """The load with the faults; then the cluster's state after the load."""
    plan = schedule(a.faults, a.duration, a.seed)
    print("faults: " + ", ".join(f"{f.kind}({f.target}) at {f.at:.0f} s" for f in plan), flush=True)
    load = Load(base, a.rate, a.duration, a.seed, a.scale, a.timeout).start()
    faults = Faults(base, auth, proc.pid, load, a.heartbeat_s, a.stop_s, int(a.l3_gib * (1 << 30)), a.seed)
    t0 = time.monotonic()
    try:
        for f in plan:
            seen.update(members(proc.pid))
            time.sleep(max(0.0, t0 + f.at - time.monotonic()))
            print(f"[{time.monotonic() - t0:6.1f} s] {f.kind} {f.target}", flush=True)
            try:
                faults.fire(f)
            except Exception as e:  # noqa: BLE001 - a fault that could not run is reported, not fatal
                f.result = {"error": f"{type(e).__name__}: {e}"}
            print(f"[{time.monotonic() - t0:6.1f} s]   {json.dumps(f.result)}", flush=True)
            seen.update(members(proc.pid))
        load.thread.join(timeout=max(0.0, t0 + a.duration + 3 * a.timeout - time.monotonic()))
    finally:
        faults.resume_all()
    seen.update(members(proc.pid))
    res = {"faults": [{"kind": f.kind, "target": f.target, "at_s": f.at,
                       "fired_s": None if f.fired is None else round(f.fired - t0, 2), **f.result} for f in plan],
           "load_finished": not load.thread.is_alive(), "seconds": round(time.monotonic() - t0, 1)}
    res["after"] = after_load(base, auth)
    res["_log"], res["_t0"] = load.target.log, t0
    return res


def main(argv=None) -> int:
    """Start, load + faults, check, stop (always), reference answers; JSON; 0 if all goals met."""
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    auth = {"Authorization": f"Bearer {token}"}
    proc, base = start(a, token, a.out / "chaos.log")
    seen: dict[int, int | None] = {}
    try:
        wait_ready(proc, base, auth, 3, 300)
        seen.update(members(proc.pid))
        res = run(a, proc, base, auth, seen)
    finally:
        left = stop(proc, seen)
    log, t0 = res.pop("_log"), res.pop("_t0")
    print(f"stopped; {len(log)} requests: computing the single-engine answers", flush=True)
    res = {"topology": "cpd-1d", "duration_s": a.duration, "rate": a.rate, "seed": a.seed, "scale": a.scale,
           "heartbeat_s": a.heartbeat_s, "drop_after_s": a.drop_after_s, "stop_s": a.stop_s, **res,
           "load": tally(log, references(log), t0), "left_behind": left}
    res["goals_missed"] = goals(res)
    res["requests"] = dump_log(log, t0)
    (a.out / "chaos.json").write_text(json.dumps(res, indent=1) + "\n")
    print_summary(res)
    return 1 if res["goals_missed"] else 0


if __name__ == "__main__":
    sys.exit(main())

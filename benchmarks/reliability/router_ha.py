"""Several routers, one killed under load (issue 56): ``warmpath serve --topology cpd-1d
--routers 2`` (two routers behind HAProxy) at ``--rate`` coding-agent sessions/s (70% of the
sustained 0.25, ``soak_load.py``'s workload), ``--kills`` router SIGKILLs per run spread over
``--duration``, for each of ``--seeds``; the same load on one router and on two without kills.

Per kill: requests sent after it that failed (goal 0); streams in flight on the dead router
and how each ended; from the kill to the first token of the first request sent after it; the
restarted router's time to ``/ready`` and to an index equal to its peer's; the fleet's
prefix hit rate (cached / prompt tokens) in the 30 s before the kill and in 10–40 s after.
In steady state, every ``--probe-s``: a recent prompt asked of both routers
(``POST /internal/decide``): the same path and workers? Then ``router_ha_index.py``: a router's
index rebuilt from 100K blocks. TTFT is timed from send = the session's arrival (open loop).
Writes ``OUT/router_ha.json``.

    python -m benchmarks.reliability.router_ha [--seeds 0,1,2] [--duration 150] [--kills 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import threading
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.reliability import router_ha_index
from benchmarks.reliability.chaos_load import ChaosTarget, dump_log
from benchmarks.reliability.cluster_procs import stop, tree, wait_ready
from benchmarks.reliability.soak_load import prime, sessions
from warmpath.procs import free_port

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--duration", type=float, default=150.0, help="seconds of session arrivals per run")
    p.add_argument("--rate", type=float, default=0.175, help="sessions/s (70%% of the 0.25 cpd-1d sustained)")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--probe-s", type=float, default=2.0)
    p.add_argument("--skip-compare", action="store_true", help="only the kill runs (no 1 vs 2 router runs)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/router_ha")
    return p.parse_args(argv)


class Run:
    """One ``warmpath serve --topology cpd-1d --routers N`` with its load."""

    def __init__(self, routers: int, seed: int, a: argparse.Namespace) -> None:
        self.token = secrets.token_urlsafe(24)
        self.auth = {"Authorization": f"Bearer {self.token}"}
        self.base = f"http://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", "cpd-1d",
                "--host", "127.0.0.1", "--port", self.base.rsplit(":", 1)[1], "--routers", str(routers),
                "--heartbeat-s", "1", "--drop-after-s", "10"]
        self.log = open(a.out / f"serve-r{routers}-s{seed}.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=ROOT, env={**os.environ, "WARMPATH_CLUSTER_TOKEN": self.token})
        self.seen: dict = {}
        self.routers, self.seed, self.a = routers, seed, a

    def cluster(self, url: str | None = None) -> dict:
        return httpx.get((url or self.base) + "/v1/cluster", headers=self.auth, timeout=5).json()

    def urls(self) -> list[str]:
        """The routers' URLs by port: ``router-I`` is the I-th (``launch/routers.py``)."""
        return sorted((r["url"] for r in self.cluster()["routers"]), key=lambda u: int(u.rsplit(":", 1)[1]))

    def close(self) -> None:
        self.seen.update({p: None for p in tree(self.proc.pid)})
        stop(self.proc, {p: None for p in self.seen})
        self.log.close()


def whole(run: Run, victim: str, peer: str) -> bool:
    """Has the restarted router the same evented index and event positions as its peer?"""
    x, y = (run.cluster(u)["routers"][0] for u in (victim, peer))
    key = lambda r: (r["index_blocks"]["local"], r["index_blocks"]["l3"], r["event_seqs"])   # noqa: E731
    return key(x) == key(y)


def kill_one(run: Run, target: ChaosTarget, i: int) -> dict:
    """SIGKILL router ``i % 2``; wait for its restart and its index; what it cost."""
    urls = run.urls()
    victim, peer = urls[i % len(urls)], urls[(i + 1) % len(urls)]
    pid = run.cluster(victim)["routers"][0]["pid"]
    in_flight = [s for s in list(target.log) if s.end is None]
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    ready = wait(lambda: httpx.get(victim + "/ready", timeout=1).status_code == 200, 120)
    index = wait(lambda: whole(run, victim, peer), 30)
    return {"victim": f"router-{urls.index(victim)}", "t_kill": t_kill, "in_flight": in_flight,
            "ready_s": None if ready is None else round(ready - t_kill, 2),
            "ready_to_index_equal_s": None if index is None or ready is None else round(index - ready, 3)}


def wait(pred, timeout: float) -> float | None:
    """When ``pred()`` first held (monotonic), or ``None`` after ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return time.monotonic()
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.05)
    return None


def probe(run: Run, target: ChaosTarget) -> bool | None:
    """A recent prompt asked of both routers: the same path, prefill and decode worker?"""
    done = [s for s in list(target.log)[-20:] if s.end is not None and not s.failed]
    if not done:
        return None
    ask = {"prompt": done[-1].prompt, "max_tokens": done[-1].max_tokens}
    try:
        got = [httpx.post(u + "/internal/decide", json=ask, headers=run.auth, timeout=5).json() for u in run.urls()]
    except (httpx.HTTPError, ValueError):
        return None
    keys = {(g.get("path"), g.get("prefill"), g.get("decode")) for g in got}
    return len(keys) == 1 if all("path" in g for g in got) else None


def start_load(target: ChaosTarget, sess: list, seed: int) -> threading.Thread:
    """The sessions through ``target`` (an open loop) on a thread."""
    from warmpath.bench import runner
    from warmpath.models.files import load_tokenizer

    encode = functools.partial(load_tokenizer().encode, add_special=False)

    async def go() -> None:
        try:
            await runner.run(target, sess, encode=encode, seed=seed)
        finally:
            await target.close()

    th = threading.Thread(target=lambda: asyncio.run(go()), daemon=True, name="ha-load")
    th.start()
    return th


def one_run(routers: int, seed: int, kills: int, a: argparse.Namespace) -> dict:
    """Start, prime, load (with ``kills`` router kills and the agreement probes), stop."""
    run = Run(routers, seed, a)
    target, events, agree = ChaosTarget(run.base, 180.0), [], []
    try:
        wait_ready(run.proc, run.base, run.auth, 3, 600)
        prime(run.base)
        t0 = time.monotonic()
        th = start_load(target, sessions(a.rate, a.duration, seed), seed)
        marks = [t0 + a.duration * (k + 1) / (kills + 1) for k in range(kills)]
        next_probe = t0 + 10
        while th.is_alive() and time.monotonic() < t0 + a.duration + 400:
            run.seen.update({p: None for p in tree(run.proc.pid)})
            if marks and time.monotonic() >= marks[0]:
                marks.pop(0)
                events.append(kill_one(run, target, len(events)))
                next_probe = time.monotonic() + 10          # steady state again
            elif routers > 1 and time.monotonic() >= next_probe:
                if (ok := probe(run, target)) is not None:
                    agree.append(ok)
                next_probe = time.monotonic() + a.probe_s
            time.sleep(0.1)
        th.join(timeout=300)
    finally:
        run.close()
    return summarize(list(target.log), t0, events, agree, routers, seed)


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return None if not xs else xs[min(len(xs) - 1, int(q * len(xs)))]


def hit_rate(log: list, lo: float, hi: float) -> float | None:
    """Cached / prompt tokens of the completed requests sent in ``[lo, hi)``."""
    got = [s for s in log if lo <= s.sent < hi and not s.failed and s.cached is not None]
    total = sum(len(s.prompt) for s in got)
    return round(sum(s.cached for s in got) / total, 4) if total else None


def per_kill(log: list, e: dict, nxt: dict | None) -> dict:
    """What one kill cost. ``failed_after``: requests sent after it (and before the next kill)
    that failed, less those in flight at the next kill (that one's cost). A request in flight at
    the kill: on the dead router by ``X-Warmpath-Router``, or unknown (no answer byte had come:
    HAProxy names the router only on the answer), or on the survivor (goal: none fails)."""
    t, until = e["t_kill"], nxt["t_kill"] if nxt else float("inf")
    later = {id(s) for s in nxt["in_flight"]} if nxt else set()
    after = [s for s in log if t <= s.sent < until]
    fl = e["in_flight"]
    soon = [s.first - s.sent for s in after if s.sent < t + 5 and s.first is not None]
    first = min((s for s in after if s.first is not None), key=lambda s: s.sent, default=None)
    return {"victim": e["victim"], "ready_s": e["ready_s"], "ready_to_index_equal_s": e["ready_to_index_equal_s"],
            "sent_after": len(after), "failed_after": sum(1 for s in after if s.failed and id(s) not in later),
            "in_flight": len(fl), "in_flight_failed": sum(1 for s in fl if s.failed),
            "in_flight_failed_on_dead_router": sum(1 for s in fl if s.failed and s.router == e["victim"]),
            "in_flight_failed_router_unknown": sum(1 for s in fl if s.failed and s.router is None),
            "in_flight_failed_on_survivor": sum(1 for s in fl if s.failed and s.router not in (None, e["victim"])),
            "first_sent_after_s": None if first is None else round(first.sent - t, 3),
            "its_ttft_s": None if first is None else round(first.first - first.sent, 3),
            "ttft_max_sent_within_5s": round(max(soon), 3) if soon else None,
            "hit_rate_before": hit_rate(log, t - 30, t), "hit_rate_10_40s_after": hit_rate(log, t + 10, t + 40)}


def summarize(log: list, t0: float, events: list, agree: list, routers: int, seed: int) -> dict:
    done = [s for s in log if not s.failed and s.first is not None]
    end = max((s.end for s in done), default=t0)
    ttft = [s.first - s.sent for s in done]
    nexts = [*events[1:], None]
    return {"routers": routers, "seed": seed, "sent": len(log), "completed": len(done),
            "failed": sum(1 for s in log if s.failed),
            "output_tok_s": round(sum(s.output_tokens for s in done) / max(1e-9, end - t0), 3),
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9), "hit_rate": hit_rate(log, t0, end + 1),
            "decisions_asked": len(agree), "decisions_same": sum(agree),
            "kills": [per_kill(log, e, n) for e, n in zip(events, nexts)],
            "requests": [{k: v for k, v in row.items() if k not in ("text",)} for row in dump_log(log, t0)]}


def main(argv=None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(["python -m benchmarks.reliability.router_ha", *(argv or sys.argv[1:])]),
           "rate": a.rate, "duration_s": a.duration, "runs": []}
    for seed in (int(x) for x in a.seeds.split(",")):
        plan = [(2, a.kills)] + ([] if a.skip_compare else [(1, 0), (2, 0)])
        for routers, kills in plan:
            print(f"seed {seed}: {routers} router(s), {kills} kill(s)", flush=True)
            r = one_run(routers, seed, kills, a)
            print(json.dumps({k: v for k, v in r.items() if k not in ("kills", "requests")}), flush=True)
            for k in r["kills"]:
                print("  kill:", json.dumps(k), flush=True)
            res["runs"].append(r)
            (a.out / "router_ha.json").write_text(json.dumps(res, indent=1) + "\n")
    res["index_rebuild"] = router_ha_index.measure()
    (a.out / "router_ha.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["index_rebuild"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

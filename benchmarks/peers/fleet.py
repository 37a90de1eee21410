"""A fleet of replica workers of one engine behind warmpath's router, started as a user would
(``warmpath serve --topology FILE.json``), for the benchmarks of issue 30 that compare what
runs behind the router (``vs_vllm.py``, ``vllm_routers.py``).

The topology file, kept in the logs folder, is ``{"policy": "replica", "workers": {"replica":
N}, "engine": ENGINE}`` plus ``"cpus"`` when given (process → CPUs, as topology files write
it): the launcher pins each named worker there before it starts, so all it starts inherit
the mask; a pinned warmpath worker gets ``--threads`` = their count and a vLLM worker binds
vLLM's OpenMP threads to them (``VLLM_CPU_OMP_THREADS_BIND``, ``warmpath/vllm/worker.py``).
Every fleet runs with ``--no-l3``, 1 s heartbeats and ``VLLM_SERVER_DEV_MODE=1`` (vLLM's
``/reset_prefix_cache``; warmpath's engine ignores it). :func:`processes` reads back what
each process really got (CPU mask, threads, the OpenMP binding).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from warmpath.procs import free_port
from warmpath.vllm.worker import cpu_string


@dataclass(frozen=True)
class Fleet:
    """A running ``warmpath serve``: the router's URL, its cluster token, each worker's
    ``/v1/cluster`` entry and the URL of the server that computes its tokens (the worker itself
    for warmpath's engine, its vLLM server's own URL for vLLM: ``vllm_url`` on its ``/health``)."""

    proc: subprocess.Popen
    url: str
    token: str
    workers: list
    engine_urls: list
    command: list
    topology: dict


def topology(engine: str, workers: int, cpus: dict | None = None) -> dict:
    """The topology file's content: ``workers`` replicas of ``engine``, pinned as ``cpus`` says."""
    return {"policy": "replica", "workers": {"replica": workers}, "engine": engine, **({"cpus": cpus} if cpus else {})}


def pd_topology(engine: str, ppd: str, cpus: dict | None = None) -> dict:
    """One prefill and one decode worker of ``engine`` under the ``pd`` policy with PPD ``ppd``."""
    return {"policy": "pd", "ppd": ppd, "workers": {"prefill": 1, "decode": 1}, "engine": engine,
            **({"cpus": cpus} if cpus else {})}


def start_fleet(engine: str, workers: int, serve_args: list[str], logs: Path, startup_s: float,
                cpus: dict | None = None, topo: dict | None = None) -> Fleet:
    """Start ``warmpath serve`` with ``workers`` replicas of ``engine`` (or the topology ``topo``,
    e.g. :func:`pd_topology`; more flags: ``serve_args``; its output: ``logs/fleet.log``) and
    wait until every worker registered."""
    topo = topo or topology(engine, workers, cpus)
    workers = sum(topo["workers"].values())
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{engine}-{topo['policy']}-{workers}.json"
    path.write_text(json.dumps(topo) + "\n")
    port = free_port()
    cmd = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", str(path),
           "--host", "127.0.0.1", "--port", str(port), "--no-l3", "--heartbeat-s", "1", *serve_args]
    token = os.environ.get("WARMPATH_CLUSTER_TOKEN") or secrets.token_urlsafe(24)   # reads worker URLs
    proc = subprocess.Popen(cmd, stdout=(logs / "fleet.log").open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1",
                                                         "WARMPATH_CLUSTER_TOKEN": token})
    base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    try:
        deadline = time.time() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the fleet exited (see {logs / 'fleet.log'})")
            try:
                ws = httpx.get(base + "/v1/cluster", timeout=2, headers=headers).json()["workers"]
                if len(ws) == workers:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.time() > deadline:
                raise RuntimeError(f"the {engine} workers did not register within {startup_s:.0f} s")
            time.sleep(2)
        urls = [httpx.get(w["url"] + "/health", timeout=5).json().get("vllm_url", w["url"]) for w in ws]
    except BaseException:
        stop_fleet(proc)
        raise
    return Fleet(proc, base, token, ws, urls, cmd, topo)


def stop_fleet(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher (it stops its workers, which stop their vLLM servers)."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def processes(root: int) -> list[dict]:
    """``root`` and every process under it: pid, command (its first 6 words), the CPUs its
    threads may run on (their union: vLLM binds each OpenMP thread to one CPU), its thread
    count, its ``--threads`` flag and ``VLLM_CPU_OMP_THREADS_BIND`` where set (Linux ``/proc``)."""
    def affinity(tid: int) -> set[int]:
        try:
            return set(os.sched_getaffinity(tid))
        except OSError:      # the thread ended meanwhile
            return set()

    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) if d.name.isdigit() else None
        except (OSError, IndexError, ValueError):
            continue
        if ppid is not None:
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        try:
            p = Path(f"/proc/{pid}")
            argv = p.joinpath("cmdline").read_bytes().split(b"\0")
            env = dict(kv.split(b"=", 1) for kv in p.joinpath("environ").read_bytes().split(b"\0") if b"=" in kv)
            threads = next(int(x.split()[1]) for x in p.joinpath("status").read_text().splitlines()
                           if x.startswith("Threads:"))
            cpus = set().union(*(affinity(int(t.name)) for t in p.joinpath("task").iterdir()))
            row = {"pid": pid, "command": shlex.join(a.decode() for a in argv[:6] if a),
                   "cpus": cpu_string(cpus), "threads": threads}
        except (OSError, StopIteration, ValueError):
            continue
        if b"--threads" in argv[:-1]:     # a warmpath worker's torch threads
            row["threads_flag"] = argv[argv.index(b"--threads") + 1].decode()
        if b"VLLM_CPU_OMP_THREADS_BIND" in env:
            row["VLLM_CPU_OMP_THREADS_BIND"] = env[b"VLLM_CPU_OMP_THREADS_BIND"].decode()
        out.append(row)
        todo += sorted(kids.get(pid, []))
    return out


def bench_cmd(url: str, out: Path, seed: int, workload: str = "coding-agent", rates: str = "0.1",
              duration: float = 300, scale: float = 0.25, slo: str | None = None,
              timeout: float = 30.0) -> list[str]:
    """``warmpath bench`` against ``url`` with text prompts (every server sees the same bytes;
    smg takes no token ids), into ``out`` (``summary.json``, ``requests.jsonl``)."""
    cmd = [sys.executable, "-m", "warmpath.cli", "bench", "--url", url, "--workload", workload,
           "--rates", rates, "--duration", str(duration), "--scale", str(scale), "--seed", str(seed),
           "--timeout", str(timeout), "--out", str(out), "--text-prompts", "--quiet"]
    return cmd + (["--slo", slo] if slo else [])


def median_tpot(rows: list[dict]) -> float:
    """The median per-request TPOT of ``requests.jsonl`` rows (requests that succeeded with one)."""
    tpots = sorted(r["tpot_s"] for r in rows if r["ok"] and r["tpot_s"])
    if not tpots:
        raise RuntimeError("no request with a TPOT")
    return statistics.median(tpots)


def unloaded_tpot(url: str, out: Path, seconds: float, workload: str = "coding-agent", scale: float = 0.25,
                  timeout: float = 30.0) -> dict:
    """The unloaded TPOT, the base of issue 28's joint target: the median per-request TPOT with
    one request in flight at a time (``bench --concurrency 1`` for ``seconds``, seed 900, text
    prompts) → ``{"command", "tpots", "median"}``, also in ``out/unloaded.json``."""
    cmd = [sys.executable, "-m", "warmpath.cli", "bench", "--url", url, "--workload", workload,
           "--concurrency", "1", "--duration", str(seconds), "--scale", str(scale), "--seed", "900",
           "--timeout", str(timeout), "--out", str(out), "--text-prompts", "--quiet"]
    subprocess.run(cmd, check=True)
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines() if x.strip()]
    res = {"command": shlex.join(cmd), "tpots": sorted(r["tpot_s"] for r in rows if r["ok"] and r["tpot_s"]),
           "median": median_tpot(rows)}
    (out / "unloaded.json").write_text(json.dumps(res, indent=1) + "\n")
    return res

"""Peer routers in front of warmpath replica workers: the SGLang Model Gateway (``smg``) and
vLLM's router (``vllm-router``), each with its prefix-aware policy (``cache_aware``: an
approximate radix tree of the request text per worker, spilling to the least loaded worker
only when the load is far out of balance). The workers are plain ``warmpath serve
--topology single`` processes (no warmpath router, no L3), one per port, all on 127.0.0.1.

Each peer is installed once, from PyPI wheels, into its own venv under ``--root``
(default ``/root/peers/<name>``), outside the repository::

    .venv/bin/python -m benchmarks.peers.peers install              # smg==1.13.0, vllm-router==0.1.17
    .venv/bin/python -m benchmarks.peers.peers check --peer smg     # 2 workers + smg: answers, stickiness
    .venv/bin/python -m benchmarks.peers.peers bench --peer vllm-router --workers 2 \\
        --workload coding-agent --rates 0.1 --duration 60 --scale 0.25 --slo ttft_p90=2.0,tpot=0.2

``check`` sends greedy 8-token ``/v1/completions`` and ``/v1/chat/completions`` (streamed and
not) through the peer and to a worker directly and requires equal answers, then sends a few
requests sharing each of three long prefixes and requires every prefix to stay on one worker
with cached prompt tokens (the worker is identified by its ``warmpath_requests_total``).
``bench`` runs ``warmpath bench --text-prompts`` against the peer (smg accepts only text
prompts, not token ids; the same flag is used for every peer so all see the same bytes) and
writes ``<out>/<peer>/summary.json``, ``report.html`` and ``peer.json`` (the exact commands).

What the peers ask of a worker (both accept warmpath's worker as it is):
* smg: ``GET /health`` (classification, health checks), ``GET /v1/models`` (model id,
  ``max_model_len``); it also probes ``/version``, ``/server_info``, ``/get_server_info``,
  ``/model_info``, ``/get_model_info``, ``/loads`` and ``/v1/loads`` and registers the worker
  as a ``generic`` OpenAI-compatible backend when they answer 404. Requests need ``model``.
* vllm-router: ``GET /health`` only; ``model`` is optional. Its ``kv_aware`` policy (exact,
  from ZeroMQ KV events: ``--kv-event-source URL=tcp://...``) is not used: it hashes the
  request's tokens with vLLM's own block hash (seeded by ``PYTHONHASHSEED``) and looks those
  keys up, while warmpath's events carry the 16-byte hashes of ``kv/hashing.py``; no key would
  ever match, and the policy would fall back to least-load on every request.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import httpx

from warmpath.procs import free_port


@dataclass(frozen=True)
class Peer:
    """One peer router: its PyPI package, the console script, and its command line."""

    name: str
    package: str
    version: str
    binary: str

    def exe(self, root: Path) -> Path:
        return root / self.name / "bin" / self.binary

    def argv(self, root: Path, port: int, workers: list[str], metrics_port: int,
             log_level: str = "info") -> list[str]:
        """Static worker URLs, the prefix-aware policy with its default thresholds, and
        every listener on 127.0.0.1."""
        cmd = [str(self.exe(root))] + (["launch"] if self.name == "smg" else [])
        return cmd + ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
                      "--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                      "--prometheus-port", str(metrics_port), "--log-level", log_level]


PEERS = {p.name: p for p in (Peer("smg", "smg", "1.13.0", "smg"),
                             Peer("vllm-router", "vllm-router", "0.1.17", "vllm-router"))}


def default_root() -> Path:
    """Where the peers are installed: ``$WARMPATH_PEERS`` or ``/root/peers``."""
    return Path(os.environ.get("WARMPATH_PEERS", "/root/peers"))


def install(peer: Peer, root: Path) -> dict:
    """``python3 -m venv ROOT/NAME && ROOT/NAME/bin/pip install --only-binary=:all: PKG==VER``
    (wheels only: a source build of these Rust crates is not attempted); skipped when the
    console script is already there. Returns the commands and the seconds taken."""
    venv = root / peer.name
    cmds = [["python3", "-m", "venv", str(venv)],
            [str(venv / "bin" / "pip"), "install", "-q", "--only-binary=:all:", f"{peer.package}=={peer.version}"]]
    if peer.exe(root).exists():
        return {"peer": peer.name, "skipped": True, "commands": [shlex.join(c) for c in cmds]}
    t0 = time.time()
    for c in cmds:
        subprocess.run(c, check=True)
    return {"peer": peer.name, "seconds": round(time.time() - t0, 1), "commands": [shlex.join(c) for c in cmds]}


def wait_until(probe, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    """Poll ``probe()`` (True = ready) until it holds; fail at once if ``proc`` exits."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        try:
            if probe():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s")


class Stack:
    """N warmpath workers (separate processes) and, optionally, one peer in front of them.
    Use as a context manager: every process it started is stopped on exit."""

    def __init__(self, n_workers: int, threads: int, logs: Path, worker_args: list[str]) -> None:
        self.n, self.threads, self.logs, self.worker_args = n_workers, threads, logs, worker_args
        self.procs: list[subprocess.Popen] = []
        self.log_files: list = []
        self.workers: list[str] = []
        self.commands: list[str] = []
        self.url: str | None = None

    def _spawn(self, cmd: list[str], log_name: str) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / log_name).open("w")   # closed in __exit__
        self.log_files.append(log)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        self.commands.append(shlex.join(cmd))
        return proc

    def start_workers(self) -> list[str]:
        env_py = sys.executable
        for i in range(self.n):
            port = free_port()
            cmd = [env_py, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", "single",
                   "--host", "127.0.0.1", "--port", str(port), "--no-l3", "--threads", str(self.threads),
                   "--worker-id", f"replica-{i}", *self.worker_args]
            self.workers.append(f"http://127.0.0.1:{port}")
            proc = self._spawn(cmd, f"worker-{i}.log")
            url = self.workers[-1]
            wait_until(lambda u=url: httpx.get(u + "/health", timeout=1).status_code == 200, proc, f"worker {url}")
        return self.workers

    def start_peer(self, peer: Peer, root: Path, log_level: str = "info") -> str:
        """Start the peer and wait until it routes a request (all workers registered)."""
        if not peer.exe(root).exists():
            raise RuntimeError(f"{peer.name} is not installed: run `benchmarks/peers/peers.py install`")
        port = free_port()
        proc = self._spawn(peer.argv(root, port, self.workers, free_port(), log_level), f"{peer.name}.log")
        self.url = f"http://127.0.0.1:{port}"

        def routed() -> bool:
            if peer.name == "smg":   # workers register in the background: wait for all of them
                ws = httpx.get(self.url + "/workers", timeout=2).json().get("workers", [])
                if sum(bool(w.get("is_healthy")) for w in ws) < self.n:
                    return False
            model = httpx.get(self.url + "/v1/models", timeout=2).json()["data"][0]["id"]
            r = httpx.post(self.url + "/v1/completions", timeout=30,
                           json={"model": model, "prompt": "ready?", "max_tokens": 1, "temperature": 0})
            return r.status_code == 200

        wait_until(routed, proc, peer.name, timeout=120)
        return self.url

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in self.log_files:
            log.close()


def bench_cmd(a: argparse.Namespace, url: str, out: Path) -> list[str]:
    """The ``warmpath bench`` point run through the peer (text prompts, see the docstring)."""
    cmd = [sys.executable, "-m", "warmpath.cli", "bench", "--url", url, "--workload", a.workload,
           "--rates", a.rates, "--duration", str(a.duration), "--scale", str(a.scale),
           "--out", str(out), "--text-prompts", "--quiet"]
    return cmd + (["--slo", a.slo] if a.slo else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("install", "check", "bench"))
    ap.add_argument("--peer", default="all", choices=("all", *PEERS))
    ap.add_argument("--root", type=Path, default=default_root())
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--worker-arg", action="append", default=["--kv-cache-gib", "0.25", "--l2-gib", "0.25"],
                    help="extra `warmpath serve` flag for every worker (repeatable)")
    ap.add_argument("--workload", default="coding-agent")
    ap.add_argument("--rates", default="0.1")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--slo", default="ttft_p90=2.0,tpot=0.2")
    ap.add_argument("--peer-log-level", default="info", help="the peer's --log-level (debug shows each decision)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/peers"))
    a = ap.parse_args()
    peers = list(PEERS.values()) if a.peer == "all" else [PEERS[a.peer]]
    if a.action == "install":
        for p in peers:
            print(json.dumps(install(p, a.root)))
        return 0
    from benchmarks.peers.peers_check import (
        check_answers,
        check_stickiness,
    )

    failed = []
    for p in peers:
        out = a.out / p.name
        with Stack(a.workers, a.threads, out / "logs", a.worker_arg) as st:
            st.start_workers()
            url = st.start_peer(p, a.root, a.peer_log_level)
            record: dict = {"peer": p.name, "version": p.version, "url": url, "commands": st.commands}
            if a.action == "check":
                record["answers"] = check_answers(url, st.workers[0])
                record["stickiness"] = check_stickiness(url, st.workers)
                ok = record["answers"]["ok"] and record["stickiness"]["ok"]
            else:
                cmd = bench_cmd(a, url, out)
                record["bench"] = shlex.join(cmd)
                ok = subprocess.run(cmd, check=False).returncode == 0
            record["ok"] = ok
            out.mkdir(parents=True, exist_ok=True)
            (out / f"peer-{a.action}.json").write_text(json.dumps(record, indent=1))
            print(json.dumps({k: v for k, v in record.items() if k != "commands"}, indent=1))
            if not ok:
                failed.append(p.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

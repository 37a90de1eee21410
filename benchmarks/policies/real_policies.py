"""Routing policies on the real engine: this machine's cluster (real processes, real Mooncake).

Part 1, CPD vs PD: a coding-agent workload scaled to the CPU (3 shared repository contexts of
1,536 tokens, sent once before measuring, reused by multi-turn sessions; 25% new
2,048-token documents; 32-token answers), ``cpd-1d`` vs ``pd-2p1d`` (the same 3 workers) at increasing session rates:
TTFT p50/p90 of warm and cold requests and the highest rate meeting the SLO below.
Part 1b, cold flood: half the sessions are new documents (``--flood-rate``): warm TTFT p50
of ``cpd-1d`` vs ``pd-2p1d``.
Part 2, PPD: 5-turn conversations (1,024-token first turn, 48-token follow-ups, 0.05
sessions/s) on ``pd-2p1d`` (1 GiB L1 per worker) with PPD ``x0`` / ``x1`` / ``dynamic``:
turn-2+ TTFT and TPOT.

    python -m benchmarks.policies.real_policies [--rates 0.05,0.1,0.15,0.2] [--duration 90] [--out DIR]

Writes ``cluster.json`` (+ one ``summary.json`` per run, usable by the bench plots).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx

from warmpath.bench.plots import plot_summaries
from warmpath.bench.prom import samples
from warmpath.bench.runner import OpenAITarget
from warmpath.bench.sweep import run_rate, sweep_summary, write_results
from warmpath.launch import launcher
from warmpath.launch.topology import resolve
from warmpath.procs import free_port
from warmpath.models.loader import load_tokenizer

from benchmarks.common.workload import SEED, SLO, TARGET, WORKERS, agent, conversations, flood, meets, prime

def l3_totals(worker_url: str) -> dict:
    """A worker's L3 bytes and seconds, read and written (its /metrics)."""
    out = dict.fromkeys(("read_bytes", "write_bytes", "read_s", "write_s"), 0.0)
    for s in samples(httpx.get(worker_url + "/metrics", timeout=10).text):
        l3 = s.labels.get("tier") == "L3"
        if s.name == "warmpath_kv_tier_read_bytes_total" and l3:
            out["read_bytes"] += s.value
        elif s.name == "warmpath_kv_tier_written_bytes_total" and l3:
            out["write_bytes"] += s.value
        elif s.name == "warmpath_kv_l3_seconds_total":
            out["read_s" if s.labels.get("op") == "read" else "write_s"] += s.value
    return out


def scrape(url: str, headers: dict | None = None) -> dict:
    """Router counters plus every worker's L3 traffic (cumulative since the cluster started);
    ``headers``: the cluster's credentials (``Cluster.headers``: worker URLs are shown to them only)."""
    c = httpx.get(url + "/v1/cluster", timeout=10, headers=headers).json()
    return {"kv_handoff_bytes": c["kv_handoff_bytes"], "ppd_decisions": c["ppd_decisions"],
            "retries": c["retries"], "routed": {w["worker_id"]: w["routed"] for w in c["workers"]},
            "l3": {w["worker_id"]: l3_totals(w["url"]) for w in c["workers"]},
            "router_latency": c["latency"],
            # what the learnt model believes, incl. ttft_error_p50: |predicted - measured| / measured
            # TTFT, median over its recent requests
            "model": c["model"]}


def without(argv: list[str], *flags: str) -> list[str]:
    """``argv`` less each ``--flag VALUE`` pair named (a standalone worker has no router to
    heartbeat to; the peer stack sets the threads itself)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in flags:
            skip = True
        else:
            out.append(x)
    return out


class Config:
    """One benchmarked configuration, started: ``TOPOLOGY[+POLICY][@PPD]`` under warmpath's
    router (e.g. ``pd-2p1d+pd-kv``, ``cpd-1d@dynamic``), or ``peer:NAME[xN]``: N (default 3)
    ``warmpath serve --topology single`` workers with the same flags behind a peer router
    (``benchmarks/peers/peers.py``: smg or vllm-router, ``cache_aware``), sent text prompts."""

    def __init__(self, name: str, ppd: str | None, workers: list[str], router_argv: list[str]) -> None:
        self.peer = name.startswith("peer:")
        self.decode = None
        if self.peer:
            from benchmarks.peers.peers import PEERS, Stack, default_root   # noqa: PLC0415 (only for peers)
            peer, _, n = name.removeprefix("peer:").partition("x")
            self.stack = Stack(int(n or 3), 1, Path("benchmarks/results/peer-logs") / peer,
                               without(workers, "--heartbeat-s", "--threads"))
            try:
                self.stack.start_workers()
                self.url = self.stack.start_peer(PEERS[peer], default_root())
            except BaseException:
                self.stack.__exit__(None, None, None)
                raise
            self.headers = None
            self.decode = functools.partial(load_tokenizer().decode, skip_special=False)
            return
        topo, _, mode = name.partition("@")
        topo, _, policy = topo.partition("+")   # "pd-2p1d+pd-kv": the same workers under another policy
        self.c = launcher.start(resolve(topo, ppd or mode or None, policy or None), "127.0.0.1", free_port(),
                                workers, router_argv, None, 2.0, 1)
        self.url, self.headers = self.c.url, self.c.headers

    def scrape(self) -> dict:
        return {} if self.peer else scrape(self.url, self.headers)

    def stop(self) -> None:
        self.stack.__exit__(None, None, None) if self.peer else self.c.stop()


def run_topology(name: str, ppd: str | None, make, rates: list[float], duration: float, out: Path,
                 encode, calibration: str | None, workers: list[str] = WORKERS, seed: int = SEED) -> dict:
    """One configuration, started once, at each rate in turn (``seed``: sessions and arrivals;
    the repository contexts are always seed ``SEED``'s)."""
    router_argv = ["--model", "smollm2"] + (["--calibration", calibration] if calibration else [])
    c = Config(name, ppd, workers, router_argv)
    label = Path(name.replace(":", "-")).stem + (f"-{ppd}" if ppd else "")
    async def sweep() -> dict:
        target = OpenAITarget(c.url, timeout_s=180, decode=c.decode)
        runs = {}
        try:
            for r in rates:
                t0 = time.time()
                res = await run_rate(target, make, r, duration, TARGET, seed=seed, encode=encode, quiet=True)
                res["cluster"] = c.scrape()
                res["meets_slo"] = meets(res["classes"])
                runs[r] = res
                cl = res["classes"]
                f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
                print(f"{label} rate {r}: warm TTFT p50 {f(cl['warm']['ttft_p50_s'])} p90 "
                      f"{f(cl['warm']['ttft_p90_s'])} | cold p50 {f(cl['cold']['ttft_p50_s'])} p90 "
                      f"{f(cl['cold']['ttft_p90_s'])} | turn2+ p50 {f(cl['turn2+']['ttft_p50_s'])} | TPOT "
                      f"{f(cl['all']['tpot_s'])} | done {cl['all']['completed']} failed {cl['all']['failed']}"
                      f" | SLO {'met' if res['meets_slo'] else 'missed'} ({time.time() - t0:.0f} s)", flush=True)
        finally:
            await target.close()
        return runs

    try:
        if make in (agent, flood):
            prime(c.url, c.decode)
        runs = asyncio.run(sweep())
    finally:
        c.stop()
    summary = {"target": label, "workload": make.__name__, **sweep_summary(runs, TARGET)}
    write_results(out / label, summary)
    return summary


def sustained(runs: dict) -> float | None:
    """The highest rate that met the SLO with every lower rate meeting it too."""
    best = None
    for r in sorted(runs, key=float):
        if not runs[r]["meets_slo"]:
            break
        best = float(r)
    return best


def ppd_table(sums: dict, r: str) -> dict:
    """Turn-2+ TTFT, TPOT, decisions and KV moved per PPD mode at rate ``r``, with x1's and
    dynamic's change against x0."""
    table = {m: {"turn2_ttft_p50_s": s["rates"][r]["turn2+"]["ttft_p50_s"],
                 "turn2_ttft_p90_s": s["rates"][r]["turn2+"]["ttft_p90_s"],
                 "tpot_s": s["rates"][r]["all"]["tpot_s"], "success": s["rates"][r]["all"]["success_rate"],
                 "ppd_decisions": s["runs"][r]["cluster"]["ppd_decisions"],
                 "kv_handoff_bytes": s["runs"][r]["cluster"]["kv_handoff_bytes"]} for m, s in sums.items()}
    base = table["x0"]
    for m in ("x1", "dynamic"):
        table[m]["turn2_ttft_cut_vs_x0"] = 1 - table[m]["turn2_ttft_p50_s"] / base["turn2_ttft_p50_s"]
        table[m]["tpot_change_vs_x0"] = table[m]["tpot_s"] / base["tpot_s"] - 1
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="0.05,0.1,0.15,0.2")
    p.add_argument("--duration", type=float, default=90.0)
    p.add_argument("--ppd-rates", default="0.05", help="part ppd: session rates")
    p.add_argument("--ppd-configs", default="pd-2p1d", help="part ppd: topologies, each run x0 / x1 / dynamic")
    p.add_argument("--ppd-calibration", choices=("calibrate", "none"), default="calibrate",
                   help="part ppd: give the router `warmpath calibrate`'s table, or none (the online model only, "
                        "as `warmpath serve` runs by default)")
    p.add_argument("--ppd-duration", type=float, default=150.0)
    p.add_argument("--flood-rate", type=float, default=0.2)
    p.add_argument("--parts", default="cpd,flood,ppd")
    p.add_argument("--configs", default="cpd-1d,pd-2p1d,replica-3",
                   help="part cpd: topologies to compare, TOPOLOGY[+POLICY] (e.g. pd-2p1d+pd-kv); the default's "
                        "replica-3 is the 3 workers' cores as replicas (replica-2: the 2-worker splits')")
    p.add_argument("--seed", type=int, default=SEED,
                   help="part cpd: seed of the sessions and arrivals (a repeat with other arrivals)")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="part cpd: one more flag for every worker (repeat: --worker-arg=--kv-dtype --worker-arg=float16)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cluster"))
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    a.out.mkdir(parents=True, exist_ok=True)
    encode = functools.partial(load_tokenizer().encode, add_special=False)
    rates = [float(x) for x in a.rates.split(",")]
    result_path = a.out / "cluster.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    result["command"] = " ".join(["python", *sys.argv])
    result["slo"] = {"warm_ttft_p90_s": SLO["warm"], "cold_ttft_p90_s": SLO["cold"], "success": TARGET.min_success,
                     "target": TARGET.to_json()}
    if "cpd" in a.parts:
        configs = a.configs.split(",")
        sums = {t: run_topology(t, None, agent, rates, a.duration, a.out, encode, None, WORKERS + a.worker_arg, a.seed)
                for t in configs}
        best = {t: sustained(s["runs"]) for t, s in sums.items()}
        top = str(max(rates))
        warm = {t: s["rates"][top]["warm"]["ttft_p50_s"] for t, s in sums.items()}
        base = max((best[t] or 0.0 for t in configs[1:]), default=0.0)
        result["cpd"] = {"sustained_rate": best, "configs": configs,
                         "rate_gain": best[configs[0]] / base if best[configs[0]] and base else None,
                         "warm_ttft_p50_at_top_rate": warm,
                         "warm_ttft_p50_cut": (min(warm[t] for t in configs[1:] if warm[t]) / warm[configs[0]]
                                               if warm[configs[0]] and any(warm[t] for t in configs[1:])
                                               else None),
                         "per_rate": {t: {r: {c: {k: s["rates"][r][c][k] for k in ("ttft_p50_s", "ttft_p90_s", "completed", "failed")}
                                                for c in ("warm", "cold")} for r in s["rates"]} for t, s in sums.items()}}
        plot_summaries(sums, a.out)
        print(json.dumps({k: v for k, v in result["cpd"].items() if k != "per_rate"}, indent=1))
    if "flood" in a.parts:
        sums = {t: run_topology(t, None, flood, [a.flood_rate], a.duration, a.out / "flood", encode, None)
                for t in ("cpd-1d", "pd-2p1d")}
        r = str(a.flood_rate)
        result["flood"] = {t: {c: {k: s["rates"][r][c][k] for k in ("ttft_p50_s", "ttft_p90_s", "completed", "failed")}
                               for c in ("warm", "cold")} for t, s in sums.items()}
        result["flood"]["warm_ttft_p50_cut"] = (result["flood"]["pd-2p1d"]["warm"]["ttft_p50_s"]
                                                / result["flood"]["cpd-1d"]["warm"]["ttft_p50_s"])
        print(json.dumps(result["flood"], indent=1))
    if "ppd" in a.parts:
        cal = a.out / "calibration.json"
        if a.ppd_calibration == "calibrate" and not cal.exists():
            subprocess.run([sys.executable, "-m", "warmpath.cli", "calibrate", "--threads", "1", "--no-served", "--out", str(cal)],
                           check=True)
        # conversations keep their whole history on the decode worker: give it room for them
        roomy = [x if x != "0.5" else "1.0" for x in WORKERS]
        ppd_rates = [float(x) for x in a.ppd_rates.split(",")]
        result["ppd"] = {}
        for topo in a.ppd_configs.split(","):
            sums = {m: run_topology(topo, m, conversations, ppd_rates, a.ppd_duration, a.out, encode,
                                    str(cal) if a.ppd_calibration == "calibrate" else None, roomy)
                    for m in ("x0", "x1", "dynamic")}
            result["ppd"][topo] = {str(r): ppd_table(sums, str(r)) for r in ppd_rates}
        print(json.dumps(result["ppd"], indent=1))
    result_path.write_text(json.dumps(result, indent=1))
    print(f"wrote {result_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""warmpath's engine vs vLLM CPU on the same model, cores and workload (issue 30, "Engines
side by side"). A report, not a target: nothing here is tuned to it.

Each engine runs alone on the machine in turn, as one replica worker behind warmpath's
router, started as a user would (``fleet.start_fleet``: ``warmpath serve --topology FILE``
with ``{"policy": "replica", "workers": {"replica": 1}, "engine": E, "cpus": {"replica-0":
CPUS}}``), with the same ``--kv-cache-gib``, ``--max-model-len`` and ``--max-num-seqs`` and
otherwise each engine's defaults (warmpath: fp16 weights, 512-token prefill chunks, L1 + L2,
no L3 (``--no-l3`` for both); vLLM: ``--dtype auto``, its own batching defaults).

**Cores**: each engine's worker process, with everything it starts, is pinned to CPUS
(``--cpus``, default: every CPU this process may use). warmpath's engine then runs
``--threads`` = that many torch threads; the vLLM worker binds vLLM's OpenMP threads to them
(``VLLM_CPU_OMP_THREADS_BIND``, one thread per CPU), and vLLM's API server and warmpath's relay
in front of it share those CPUs. The router is not pinned. ``vs_vllm.json`` records what each
process really got (``engines.<e>.processes``: CPU mask, threads, the OpenMP binding).

Per engine, in order (the first engine of ``--engines`` sets the common target):

* **micro** (``http_micro.run_micro``), timed directly against the server that computes the
  tokens, no router and no relay: warmpath's worker URL, vLLM's own server URL (``vllm_url``
  on the worker's ``/health``). Streamed ``/v1/completions`` with **token-id prompts, the same
  ids for both** (fixed seeds), ``temperature: 0``, ``ignore_eos``: TTFT of a cold
  ``--prefill-tokens`` prompt (``max_tokens: 1``, a new prompt per repeat) and its tok/s,
  batch-1 decode TPOT, and ``--streams`` concurrent decodes (output tok/s and TPOT).
* **unloaded TPOT** (``fleet.unloaded_tpot``: coding-agent, one request at a time,
  ``--unloaded-s``) through the router. The joint target of issue 28
  (``benchmarks/policies/ranking.joint_target``: warm TTFT p90 ≤ 2 s, cold ≤ 20 s, per-request
  TPOT p90 ≤ 1.5× the unloaded TPOT, 90% attaining) is built from the *first* engine's unloaded
  TPOT and is the **common target** both engines are judged by (``--slo`` replaces it); each
  engine's sweep is also judged against the target built from its own unloaded TPOT.
* **sustained rate**: ``warmpath bench --workload coding-agent --rates R --text-prompts --slo
  <common target>`` through the router (**the same text for both**, each engine tokenizes it;
  the same router, so the engine — and for vLLM the worker's relay — is the only difference):
  the highest rate meeting the target with every lower one, per seed.

Usage::

    .venv/bin/python -m benchmarks.peers.vs_vllm             # full (≈ 30 min on 2 cores, + 20 per extra seed)
    .venv/bin/python -m benchmarks.peers.vs_vllm --smoke     # wiring only (≈ 5-8 min, most of it vLLM's start)

Writes, under ``--out`` (default ``benchmarks/results/peers/vs_vllm``; ``--smoke``:
``/tmp/vs_vllm_smoke``), ``vs_vllm.json`` (settings, targets, commands, per engine:
registration, processes, micro, unloaded TPOT, bench summaries) and ``table.md``, after each
engine; each bench run in ``<engine>/seed<S>/``, each fleet's output in
``<engine>/logs/fleet.log``. Installs the vLLM peer when missing (``benchmarks/peers/vllm_cpu.py``).
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

from benchmarks.peers.fleet import bench_cmd, processes, start_fleet, stop_fleet, unloaded_tpot
from benchmarks.peers.http_micro import micro_rows, run_micro
from benchmarks.peers.tables import compare_table, sustained_rows, workload_table
from benchmarks.peers.vllm_cpu import install as install_vllm
from benchmarks.policies.ranking import goodputs, joint_target, records, verdicts
from warmpath.slo import Target
from warmpath.launch.topology import parse_cpus
from warmpath.vllm.worker import cpu_string

ENGINES = ("warmpath", "vllm")
SMOKE = {"micro_repeats": 1, "streams": 4, "decode_tokens": 16, "prefill_tokens": 256, "unloaded_s": 10.0,
         "rates": "0.5", "duration": 10.0, "scale": 0.05, "seeds": "0"}


def threads_note(engine: str, cpus: str) -> str:
    """How the engine's threads were set, for the output."""
    n = len(parse_cpus(cpus, "--cpus"))
    if engine == "vllm":
        return f"worker + vLLM pinned to CPUs {cpus}; VLLM_CPU_OMP_THREADS_BIND={cpus} ({n} OpenMP threads)"
    return f"worker pinned to CPUs {cpus}; --threads {n} (torch threads)"


def serve_args(engine: str, a: argparse.Namespace) -> list[str]:
    """The ``warmpath serve`` flags of ``engine``'s fleet besides the topology."""
    common = ["--kv-cache-gib", str(a.kv_cache_gib), "--max-model-len", str(a.max_model_len),
              "--max-num-seqs", str(a.max_num_seqs)]
    return common + shlex.split(a.vllm_serve_args if engine == "vllm" else a.warmpath_serve_args)


def goodput_under(rows: list[dict], duration_s: float, target: Target) -> float | None:
    """The highest rate of a sweep's ``requests.jsonl`` rows meeting ``target`` with every
    lower rate meeting it (``None``: the lowest missed), judged as ``warmpath bench`` judges."""
    by_rate: dict[float, list[dict]] = {}
    for r in rows:
        by_rate.setdefault(r["rate"], []).append(r)
    return goodputs({rate: verdicts(records(rs), duration_s, rate, {"t": target}) for rate, rs in by_rate.items()})["t"]


def sweep(engine: str, url: str, a: argparse.Namespace, own: Target) -> list[dict]:
    """``warmpath bench`` per seed against the router under the common target; each run also
    judged against the engine's own joint target (``own``)."""
    out = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        d = a.out / engine / f"seed{seed}"
        cmd = bench_cmd(url, d, seed, "coding-agent", a.rates, a.duration, a.scale, a.slo, a.timeout)
        code = subprocess.run(cmd, check=False).returncode
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else None
        rows = [json.loads(x) for x in (d / "requests.jsonl").read_text().splitlines() if x.strip()] \
            if (d / "requests.jsonl").is_file() else []
        out.append({"seed": seed, "bench": shlex.join(cmd), "exit": code, "summary": summary,
                    "own_target_rate": goodput_under(rows, a.duration, own) if rows else None})
        print(f"{engine}: seed {seed}: exit {code}, highest rate meeting the common target "
              f"{(summary or {}).get('max_rate_meeting_slo')}, its own {out[-1]['own_target_rate']}", flush=True)
    return out


def run_engine(engine: str, a: argparse.Namespace) -> dict:
    """Start ``engine``'s one-worker fleet, measure what was asked, stop it. Sets ``a.slo`` (the
    common target) from this engine's unloaded TPOT when it is not set yet."""
    t0 = time.time()
    fleet = start_fleet(engine, 1, serve_args(engine, a), a.out / engine / "logs", a.startup_s,
                        {"replica-0": a.cpus})
    try:
        rec = {"engine": engine, "fleet": shlex.join(fleet.command), "topology": fleet.topology,
               "startup_s": round(time.time() - t0, 1), "threads": threads_note(engine, a.cpus),
               "processes": processes(fleet.proc.pid), "engine_url": fleet.engine_urls[0],
               "worker": fleet.workers[0], "micro": None, "unloaded_tpot": None, "own_target": None, "sustained": []}
        print(f"{engine}: up in {rec['startup_s']} s; {rec['threads']}", flush=True)
        if engine == "vllm":
            from warmpath.vllm.load import parse_metrics

            rec["vllm_kv_tokens"] = parse_metrics(httpx.get(fleet.engine_urls[0] + "/metrics",
                                                            timeout=10).text).kv_tokens
        if not a.skip_micro:
            key = fleet.token if engine == "warmpath" else None    # a worker behind a router asks for it on /v1
            rec["micro"] = asyncio.run(run_micro(fleet.engine_urls[0], a.micro_repeats, a.streams, a.decode_tokens,
                                                 a.prefill_tokens, api_key=key))
            print(f"{engine}: micro done", flush=True)
        if not a.skip_sustained:
            rec["unloaded_tpot"] = unloaded_tpot(fleet.url, a.out / engine / "unloaded", a.unloaded_s,
                                                 scale=a.scale, timeout=a.timeout)
            own = joint_target(rec["unloaded_tpot"]["median"])
            rec["own_target"] = own.spec()
            a.slo = a.slo or rec["own_target"]
            print(f"{engine}: unloaded TPOT {rec['unloaded_tpot']['median']:.4f} s; own target {own.spec()}; "
                  f"common target {a.slo}", flush=True)
            rec["sustained"] = sweep(engine, fleet.url, a, own)
    finally:
        stop_fleet(fleet.proc)
    return rec


def report(records_: dict[str, dict], a: argparse.Namespace) -> str:
    """The Markdown tables: bench rows per engine and seed, then the two engines side by side."""
    micro = {e: r["micro"] for e, r in records_.items() if r["micro"]}
    runs = {e: [s for s in r["sustained"] if s["summary"]] for e, r in records_.items()}
    rows = micro_rows(micro, a.streams, a.prefill_tokens) if micro else []
    rows.append(("unloaded TPOT ms (coding-agent, one request at a time, median)",
                 {e: r["unloaded_tpot"]["median"] * 1e3 for e, r in records_.items() if r["unloaded_tpot"]}, True))
    rows += sustained_rows({e: [s["summary"] for s in v] for e, v in runs.items()},
                           f"coding-agent sessions/s meeting the common target (of {a.rates})")
    rows += sustained_rows({e: [{"max_rate_meeting_slo": s["own_target_rate"]} for s in v] for e, v in runs.items()},
                           "the same, each engine's own joint target")
    work = {f"{e}/coding-agent seed {s['seed']}": s["summary"] for e, v in runs.items() for s in v}
    lines = [f"threads: {e}: {r['threads']}" for e, r in records_.items()]
    lines += [f"common target: {a.slo}"] + [f"own target: {e}: {r['own_target']}" for e, r in records_.items()] + [""]
    lines += (workload_table(work) + [""]) if work else []
    return "\n".join(lines + compare_table(rows, ENGINES))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default=",".join(ENGINES), help="which to run, in order (the first sets the target)")
    ap.add_argument("--cpus", default=None, help="CPUs for each engine, e.g. 0-1 (default: all this process may use)")
    ap.add_argument("--kv-cache-gib", type=int, default=1, help="both engines' KV pool (vLLM: whole GiB)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--warmpath-serve-args", default="", help="more `warmpath serve` flags for warmpath's engine")
    ap.add_argument("--vllm-serve-args", default="", help="more `warmpath serve` flags for the vLLM fleet, "
                    "e.g. \"--vllm-args '--max-num-batched-tokens 512'\"")
    ap.add_argument("--micro-repeats", type=int, default=5)
    ap.add_argument("--streams", type=int, default=16, help="concurrent decode streams")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=2048)
    ap.add_argument("--unloaded-s", type=float, default=60.0, help="seconds of one-at-a-time requests (unloaded TPOT)")
    ap.add_argument("--rates", default="0.05,0.1,0.2,0.4", help="coding-agent sessions/s, in turn")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds at each rate")
    ap.add_argument("--scale", type=float, default=0.25, help="coding-agent lengths × this")
    ap.add_argument("--seeds", default="0", help="one sweep per seed, e.g. 0,1,2")
    ap.add_argument("--slo", default=None, help="the common target (slo.py syntax; default: the joint "
                    "target from the first engine's unloaded TPOT)")
    ap.add_argument("--timeout", type=float, default=30.0, help="a bench request failing")
    ap.add_argument("--startup-s", type=float, default=1200.0)
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--skip-sustained", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="wiring only: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in SMOKE.items()))
    ap.add_argument("--out", type=Path, default=None,
                    help="default benchmarks/results/peers/vs_vllm (--smoke: /tmp/vs_vllm_smoke)")
    a = ap.parse_args(argv)
    if a.smoke:
        vars(a).update(SMOKE)
    a.out = a.out or Path("/tmp/vs_vllm_smoke" if a.smoke else "benchmarks/results/peers/vs_vllm")
    if bad := [e for e in a.engines.split(",") if e not in ENGINES]:
        ap.error(f"--engines: unknown {bad}; known: {', '.join(ENGINES)}")
    avail = os.sched_getaffinity(0)
    try:
        cpus = parse_cpus(a.cpus, "--cpus") if a.cpus else avail
        Target.parse(a.slo)
    except ValueError as e:
        ap.error(str(e))
    if missing := sorted(set(cpus) - set(avail)):
        ap.error(f"--cpus: CPU {', '.join(map(str, missing))} not available here ({cpu_string(avail)} are)")
    a.cpus = cpu_string(cpus)
    if a.streams > a.max_num_seqs or a.prefill_tokens + 8 > a.max_model_len:
        ap.error("need --streams ≤ --max-num-seqs and --prefill-tokens + 8 ≤ --max-model-len")
    if a.kv_cache_gib < 1:
        ap.error("--kv-cache-gib must be a whole number ≥ 1 (vLLM's VLLM_CPU_KVCACHE_SPACE)")
    return a


def write(records_: dict[str, dict], a: argparse.Namespace) -> str:
    """``vs_vllm.json`` and ``table.md`` of the engines run so far; the table."""
    table = report(records_, a)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(table + "\n")
    (a.out / "vs_vllm.json").write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(a).items()}, "argv": sys.argv, "common_target": a.slo, "prompts": {
            "micro": "token ids, the same for both engines (http_micro.prompt, fixed seeds)",
            "sustained": "text (warmpath bench --text-prompts), the same for both engines"},
        "engines": records_}, indent=1) + "\n")
    return table


def main() -> int:
    a = parse_args()
    engines = a.engines.split(",")
    if "vllm" in engines:
        install_vllm()
    done: dict[str, dict] = {}
    for e in engines:
        done[e] = run_engine(e, a)
        table = write(done, a)    # after each engine: a failure later keeps what was measured
    print(table)
    return 0 if all(s["exit"] == 0 for r in done.values() for s in r["sustained"]) else 1


if __name__ == "__main__":
    sys.exit(main())

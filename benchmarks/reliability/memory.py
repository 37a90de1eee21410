"""Memory of a running cluster (issue 18): RSS, PSS and USS of every process.

Starts ``warmpath serve --topology cpd-1d`` with default flags (only ``--threads``, the
address and any ``--serve-arg`` added) on a free port, waits until every worker has
registered, sends a few chat requests through the router (a cold prompt, a warm follow-up
that extends it, the same follow-up again) so that the KV pools and the store are used, then
reads each process of the cluster (the launcher and every process below it in /proc: the
router, the workers, ``mooncake_master``, the store's segment holder):

* RSS, split into anonymous / file-backed / shmem (``/proc/PID/status``);
* PSS (shared pages divided among the processes that map them) and USS (pages of this
  process alone), from ``/proc/PID/smaps_rollup``;
* each process's largest mappings (``/proc/PID/smaps``: heap, model file, KV pools, ...) and
  each worker's KV pool capacity (``warmpath_kv_tier_capacity_bytes``), hence an upper bound
  of the RSS once every pool and the store are full (CPU pools are committed as used).

Prints a table and writes ``OUT/<label>.json``; stops everything it started even when a
step fails (the launcher's process group, then any process of the tree still alive, by PID).

    python -m benchmarks.reliability.memory [--label after] [--threads 2] [--serve-arg=--l2-gib --serve-arg=1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx

from warmpath.bench.prom import sample_value
from benchmarks.reliability.cluster_procs import cmdline, start_time, stop, tree, wait_ready
from warmpath.launch.topology import resolve
from warmpath.procs import free_port

ROOT = Path(__file__).resolve().parents[2]

MIB = 1 << 20
STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")
ROLLUP_KEYS = ("Pss", "Pss_Anon", "Pss_File", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty")
PROMPT = ("You are a careful assistant. Summarise the following notes about caches in three short "
          "sentences. A cache keeps recently used data close to where it is needed. ") * 6


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topology", default="cpd-1d")
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads per worker (serve --threads; 0: not passed, the launcher's default)")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="one more `warmpath serve` argument (repeatable; write --serve-arg=--flag)")
    p.add_argument("--label", default="current", help="name of the result file")
    p.add_argument("--settle-s", type=float, default=3.0, help="wait after the requests before sampling")
    p.add_argument("--timeout-s", type=float, default=600.0, help="how long startup may take")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/memory")
    return p.parse_args(argv)


def _kib_fields(path: Path, keys: tuple[str, ...]) -> dict[str, int]:
    """``key: N kB`` lines of a /proc file, in bytes."""
    out = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition(":")
        if k in keys:
            out[k] = int(v.split()[0]) * 1024
    return out


def name_of(argv: list[str]) -> str:
    """A short name for a cluster process from its command line."""
    if argv and argv[0].endswith("mooncake_master"):
        return "mooncake_master"
    if "warmpath.kv.mooncake_service" in argv:
        return "mooncake segment holder"
    if "--worker-id" in argv:
        return "worker " + argv[argv.index("--worker-id") + 1]
    for cmd in ("router", "serve"):
        if cmd in argv:
            return "launcher (serve)" if cmd == "serve" else "router"
    return " ".join(argv)[:40]


def sample(pid: int) -> dict | None:
    """RSS (status), PSS / USS (smaps_rollup) of one process, in bytes; None if it is gone."""
    d = Path(f"/proc/{pid}")
    try:
        argv = cmdline(pid)
        st = _kib_fields(d / "status", STATUS_KEYS)
        ro = _kib_fields(d / "smaps_rollup", ROLLUP_KEYS)
    except OSError:
        return None
    return {"pid": pid, "name": name_of(argv), "rss": st.get("VmRSS", 0), "rss_anon": st.get("RssAnon", 0),
            "rss_file": st.get("RssFile", 0), "rss_shmem": st.get("RssShmem", 0), "peak_rss": st.get("VmHWM", 0),
            "pss": ro.get("Pss", 0), "pss_anon": ro.get("Pss_Anon", 0), "pss_file": ro.get("Pss_File", 0),
            "uss": ro.get("Private_Clean", 0) + ro.get("Private_Dirty", 0), "argv": argv}


def mappings(pid: int, top: int = 10) -> list[dict]:
    """The ``top`` mappings of ``pid`` by RSS (MiB): what they map, their size, RSS and PSS."""
    rows, cur = [], None
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            cur = {"what": head[5] if len(head) > 5 else "[anon]", "size": (hi - lo) / MIB}
            rows.append(cur)
        elif cur is not None and head and head[0] in ("Rss:", "Pss:"):
            cur[head[0][:-1].lower()] = int(head[1]) * 1024 / MIB
    rows.sort(key=lambda r: -r.get("rss", 0))
    return [{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()} for r in rows[:top]]


def chat(base: str, messages: list[dict], max_tokens: int = 16) -> dict:
    """One greedy chat completion through the router; its usage."""
    r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": "SmolLM2-135M-Instruct", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    body = r.json()
    return {"text": body["choices"][0]["message"]["content"], "usage": body["usage"]}


def exercise(base: str) -> list[dict]:
    """A cold prompt, then a follow-up on the same conversation twice (warm)."""
    first = [{"role": "user", "content": PROMPT}]
    a = chat(base, first)
    follow = first + [{"role": "assistant", "content": a["text"]},
                      {"role": "user", "content": "Now say it in one sentence. " * 4}]
    return [a, chat(base, follow), chat(base, follow)]


def capacities(base: str, auth: dict) -> dict[int, int]:
    """Worker PID -> bytes its KV pools hold when full (L1 + L2, from its /metrics)."""
    out = {}
    for w in httpx.get(base + "/v1/cluster", timeout=10, headers=auth).json()["workers"]:
        text = httpx.get(w["url"] + "/metrics", timeout=10, headers=auth).text
        out[w["pid"]] = int(sum(sample_value(text, "warmpath_kv_tier_capacity_bytes", tier=t) or 0
                                for t in ("L1", "L2")))
    return out


def full_bound(rows: list[dict]) -> int:
    """An upper bound of the cluster's RSS once every pool is full: each worker's RSS plus its
    pools' capacity, the segment holder's plus the store's size (pages already touched are
    counted twice, so it overstates by what the requests wrote)."""
    extra = 0
    for r in rows:
        extra += r.get("kv_capacity", 0)
        if "--segment-bytes" in r["argv"]:
            extra += int(r["argv"][r["argv"].index("--segment-bytes") + 1])
    return sum(r["rss"] for r in rows) + extra


def table(rows: list[dict]) -> str:
    """The samples as a text table (MiB), with a total line."""
    cols = ("rss", "rss_anon", "rss_file", "pss", "uss", "peak_rss")
    lines = [f"{'process':<26}{'pid':>8}" + "".join(f"{c:>10}" for c in cols)]
    for r in rows:
        lines.append(f"{r['name']:<26}{r['pid']:>8}" + "".join(f"{r[c] / MIB:>10.0f}" for c in cols))
    lines.append(f"{'total':<26}{'':>8}" + "".join(f"{sum(r[c] for r in rows) / MIB:>10.0f}" for c in cols))
    return "\n".join(lines)


def run(a: argparse.Namespace, argv: list[str], log: Path) -> dict:
    """Start, exercise, sample, stop; the result."""
    token = secrets.token_urlsafe(24)
    auth = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
    seen: dict[int, int] = {}
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                env={**os.environ, "WARMPATH_CLUSTER_TOKEN": token})
    try:
        t0 = time.monotonic()
        wait_ready(proc, base, auth, resolve(a.topology).size, a.timeout_s)
        startup = time.monotonic() - t0
        seen.update((p, start_time(p)) for p in tree(proc.pid))
        answers = exercise(base)
        cap = capacities(base, auth)
        time.sleep(a.settle_s)
        pids = tree(proc.pid)
        seen.update((p, start_time(p)) for p in pids)
        rows = [s for p in pids if (s := sample(p)) is not None]
        for r in rows:
            r["top_mappings"] = mappings(r["pid"])
            if r["pid"] in cap:
                r["kv_capacity"] = cap[r["pid"]]
    finally:
        stop(proc, seen)
    rows.sort(key=lambda r: r["name"])
    totals = {c: sum(r[c] for r in rows) for c in ("rss", "rss_anon", "rss_file", "pss", "uss")}
    totals["rss_pools_full_bound"] = full_bound(rows)
    return {"label": a.label, "command": " ".join(argv[1:]), "startup_s": round(startup, 1),
            "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "git": _git(),
            "requests": [x["usage"] for x in answers], "processes": rows, "totals": totals,
            "totals_gib": {k: round(v / (1 << 30), 3) for k, v in totals.items()}}


def _git() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                          capture_output=True, text=True, timeout=10).stdout.strip()


def main(argv=None) -> int:
    """Run once and report (see the module docstring)."""
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", a.topology,
           "--host", "127.0.0.1", "--port", str(free_port()), *(["--threads", str(a.threads)] if a.threads else []),
           *a.serve_arg]
    res = run(a, cmd, a.out / f"{a.label}.log")
    print(f"warmpath {res['command']}  (started in {res['startup_s']} s, {res['git']})")
    print(table(res["processes"]))
    print(f"upper bound with every KV pool and the store full: {res['totals']['rss_pools_full_bound'] / MIB:.0f} MiB")
    print("requests (prompt / cached tokens):",
          ", ".join(f"{u['prompt_tokens']}/{(u.get('prompt_tokens_details') or {}).get('cached_tokens', 0)}"
                    for u in res["requests"]))
    (a.out / f"{a.label}.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The served part of ``warmpath calibrate``: start the topology as ``warmpath serve`` would
(real router, workers, Mooncake), drive it, and measure what an isolated step profile cannot.

1. **Request overhead**: requests one at a time (nothing queues); each one's client TTFT less
   the prefill worker's own time (the router's ``Server-Timing`` stage ``prefill_worker``) is
   the router, HTTP and relay time the simulator adds per request.
2. **Steps under load**: the coding-agent workload at ``rates`` (a seed of its own, never a
   user's) with every worker's step trace on: the steps that ran alone join the fit, and the
   traces give the steps' scatter (``step_cv``) and how much slower a step computes beside
   another worker (``contention``), as ``calibrate --from-trace`` measures them.
3. **Transfer CPU**: the Mooncake segment holder's CPU seconds over the workers' KV-tier
   seconds (the cores a transfer keeps busy on the store's side).

Everything started here is stopped before it returns, also on errors.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from warmpath.engine.step_trace import read_step_trace


@dataclass(frozen=True)
class ServedCalibrationConfig:
    """What the served phase runs: ``topology`` with ``serve_args`` (extra ``warmpath serve``
    flags), ``sequential`` one-at-a-time requests, then ``duration_s`` of load at each rate."""

    topology: str = "cpd-1d"
    serve_args: tuple[str, ...] = ()
    sequential: int = 16
    rates: tuple[float, ...] = (0.1, 0.2)
    duration_s: float = 60.0
    seed: int = 900_001
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.sequential < 3:
            raise ValueError(f"served calibration: need >= 3 sequential requests, got {self.sequential}")
        if not self.rates or min(self.rates) <= 0 or self.duration_s <= 0:
            raise ValueError(f"served calibration: rates and duration must be > 0, got {self.rates}, {self.duration_s}")


def server_timing(header: str) -> dict[str, float]:
    """A ``Server-Timing`` header → seconds per stage (``name;dur=ms`` entries)."""
    out = {}
    for part in filter(None, (x.strip() for x in header.split(","))):
        name, sep, dur = part.partition(";dur=")
        if sep:
            out[name.strip()] = float(dur) / 1000
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def tier_seconds(steps: dict[str, list[dict]], since: float = float("-inf")) -> float:
    """The workers' KV-tier seconds (L3 loads and puts at the ends of their steps), of the
    steps that began at ``since`` or later (``time.monotonic()``, the traces' clock)."""
    return sum(s.get("tiers_s", 0.0) for ss in steps.values() for s in ss if s["t0"] >= since)


def overhead_of(rows: list[dict]) -> float | None:
    """Median of client TTFT less the prefill worker's time over requests that have both."""
    got = [r["client_ttft_s"] - r["prefill_worker"] for r in rows
           if r.get("client_ttft_s") is not None and r.get("prefill_worker") is not None]
    return max(0.0, statistics.median(got)) if got else None


async def request_once(http, url: str, prompt: list[int], max_tokens: int, sid: str,
                       headers: dict | None = None) -> dict:
    """One greedy streamed ``/v1/completions`` request: its client TTFT, the router's
    ``Server-Timing`` stages, the cached tokens it reported, its route and its answer's text."""
    import json

    from httpx_sse import aconnect_sse

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "user": sid, "stream_options": {"include_usage": True}}
    t0, first, usage, text = time.perf_counter(), None, {}, []
    async with aconnect_sse(http, "POST", url + "/v1/completions", json=body, headers=headers or {}) as es:
        r = es.response
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {await r.aread()!r}")
        stages = server_timing(r.headers.get("server-timing", ""))
        async for ev in es.aiter_sse():
            if ev.data == "[DONE]":
                break
            ch = json.loads(ev.data)
            if ch.get("error"):
                raise RuntimeError(f"stream error: {ch['error']}")
            got = "".join(c.get("text") or "" for c in ch.get("choices") or [])
            if first is None and got:
                first = time.perf_counter() - t0
            text.append(got)
            usage = ch.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"prompt_tokens": len(prompt), "cached_tokens": cached, "client_ttft_s": first,
            "path": r.headers.get("x-warmpath-route"), "text": "".join(text), **stages}


async def _sequential(url: str, sessions, encode, headers: dict, limit: int) -> list[dict]:
    """The sessions' turns one at a time (answers re-tokenized into the history), ``limit`` in all."""
    import httpx

    rows: list[dict] = []
    async with httpx.AsyncClient(timeout=600) as http:
        await request_once(http, url, [1, 2, 3, 4], 2, "calibrate-warmup", headers)
        for s in sessions:
            hist = list(s.prefix)
            for t in s.turns:
                if len(rows) == limit:
                    return rows
                hist += t.new_tokens
                row = await request_once(http, url, list(hist), t.max_tokens, s.sid, headers)
                hist += encode(row.pop("text"))
                rows.append(row)
    return rows


def run_served(cfg: ServedCalibrationConfig, workdir: Path, model: str = "smollm2") -> dict:
    """Start ``cfg.topology``, measure (module docstring), stop; returns the measurements and
    the step traces' folder (``workdir / "trace"``)."""
    from warmpath.bench.cli import run as bench_run
    from warmpath.bench.workload import coding_agent
    from warmpath.cli_args import serve_namespace
    from warmpath.launch import launcher
    from warmpath.models.loader import load_tokenizer
    from warmpath.procs import free_port

    trace_dir = workdir / "trace"
    a = serve_namespace(["--topology", cfg.topology, "--host", "127.0.0.1", "--port", str(free_port()),
                         "--model", model, "--step-trace", str(trace_dir), *cfg.serve_args])
    c = launcher.start_from_args(a)
    try:
        tok = load_tokenizer()
        encode = lambda text: tok.encode(text, add_special=False)   # noqa: E731
        sessions = coding_agent(cfg.sequential, seed=cfg.seed, scale=cfg.scale)   # >= 1 turn each
        auth = {"Authorization": f"Bearer {c.api_keys[0]}"} if c.api_keys else {}
        rows = asyncio.run(_sequential(c.url, sessions, encode, auth, cfg.sequential))
        holder = c.service.holder_proc.pid if c.service and c.service.holder_proc else None
        h0, load_t0 = (cpu_seconds(holder) if holder else 0.0), time.monotonic()   # the traces' clock
        for i, rate in enumerate(cfg.rates):
            argv = ["--url", c.url, "--workload", "coding-agent",
                    "--rate", str(rate), "--duration", str(cfg.duration_s), "--seed", str(cfg.seed + 1 + i),
                    "--scale", str(cfg.scale), "--quiet", "--out", str(workdir / f"load_{rate:g}")]
            if c.api_keys:
                argv += ["--api-key", c.api_keys[0]]
            try:
                bench_run(argv)
            except ValueError as e:
                raise RuntimeError(f"served calibration: the load at {rate:g}/s failed ({e})") from e
        holder_s = (cpu_seconds(holder) - h0) if holder else 0.0
    finally:
        c.stop()
    tiers = tier_seconds(read_step_trace(trace_dir), since=load_t0)
    return {"topology": cfg.topology, "requests": rows, "request_overhead_s": overhead_of(rows),
            "transfer_cpu": holder_s / tiers if tiers > 0 else None, "holder_cpu_s": holder_s,
            "tier_s": tiers, "trace": str(trace_dir)}


def served_engine(a, max_position_embeddings: int, block_bytes: int, workers: int) -> dict:
    """The engine and KV sizes a worker of ``warmpath serve`` flags ``a`` runs with (the
    simulator's CPU profile takes them as its defaults): L1 / L2 blocks per worker, the private
    store's GiB, the scheduler's limits and the machine's cores."""
    from warmpath.kv.sizing import GIB, blocks_in, l1_blocks, store_bytes

    max_len = min(a.max_model_len or max_position_embeddings, max_position_embeddings)
    l1 = l1_blocks(None if a.kv_cache_gib == "auto" else a.kv_cache_gib, block_bytes, max_len,
                   a.block_size, a.max_num_seqs)
    l2 = l1 if a.l2_gib == "auto" else (blocks_in(a.l2_gib, block_bytes) if a.l2_gib else 0)
    l3 = 0.0 if a.no_l3 else (store_bytes(workers, l1, block_bytes) / GIB if a.l3_gib == "auto" else a.l3_gib)
    return {"l1_blocks": l1, "l2_blocks": l2, "l3_gib": l3, "block_size": a.block_size,
            "max_num_seqs": a.max_num_seqs, "max_num_batched_tokens": a.max_num_batched_tokens,
            "cores": os.cpu_count() or 1}


def served_engine_for(topology: str, serve_args: list[str], model: str, max_position_embeddings: int,
                      kv_bytes_per_token: int) -> dict:
    """:func:`served_engine` of ``warmpath serve --topology TOPOLOGY --model MODEL SERVE_ARGS``."""
    from warmpath.cli_args import serve_namespace
    from warmpath.launch.topology import resolve

    a = serve_namespace(["--topology", topology, "--model", model, *serve_args])
    return served_engine(a, max_position_embeddings, kv_bytes_per_token * a.block_size,
                         resolve(a.topology, a.ppd, a.route_policy).size)

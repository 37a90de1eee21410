"""``warmpath calibrate --engine vllm``: time a vLLM server's steps over its OpenAI HTTP API and
write the same calibration file ``warmpath calibrate`` writes for warmpath's engine (fitted by
the same code, ``calibrate/fit.fitted``), so ``warmpath sim`` / ``plan`` / ``serve
--calibration`` predict a vLLM fleet.

The server is the one ``warmpath worker --engine vllm`` would start with the same worker flags
(``--serve-args``; ``vllm/worker.server_config``), or a running one (``--url``). What is timed,
every prompt as token ids so vLLM computes exactly them:

* **prefill** (``tokens, context, s``): a context of ``c`` random tokens cold, then ``t`` new
  tokens after it (its blocks now in vLLM's prefix cache), then one token after it (a cached
  prefix loaded, nearly nothing computed); each the time to its first streamed token, with
  ``context`` = the tokens vLLM reports cached and ``tokens`` = the rest;
* **decode** (``batch, context, s``): ``b`` requests of one context sent at once, each running
  ``decode_tokens`` tokens; the step is the median gap between a request's streamed tokens
  while all ``b`` decode (:func:`decode_step`).

No mixed steps are timed (vLLM interleaves them itself): the fit keeps the assumed mixed form
(``StepModel.mixed_form`` says so). The prefill line's intercept includes vLLM's HTTP path.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import os
import shlex
import statistics
import time
from pathlib import Path

import httpx
import numpy as np

from warmpath.engine.step_model import StepProfile

SIM_BLOCK = 16                    # the simulator counts KV in 16-token blocks (sim/cli.py)
VLLM_CPU_BATCHED_TOKENS = 2048    # vLLM's default max_num_batched_tokens for its API server on CPU


def prefill_row(usage: dict, ttft_s: float) -> tuple[int, int, float]:
    """A timed prefill as ``(tokens computed, tokens cached before them, seconds)`` from vLLM's usage."""
    cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    return int(usage["prompt_tokens"]) - cached, cached, ttft_s


def decode_step(times: list[list[float]], skip: int = 1) -> float:
    """The decode step of requests that ran together, from each one's token arrival times:
    the median gap between consecutive tokens of a request while every request decodes
    (after each one's first ``skip + 1`` tokens, before the first one ends). ``ValueError``
    when no such gap exists."""
    if not times or any(len(t) < skip + 2 for t in times):
        raise ValueError(f"decode_step: every request needs > {skip + 1} tokens")
    start, end = max(t[skip] for t in times), min(t[-1] for t in times)
    gaps = [b - a for t in times for a, b in itertools.pairwise(t) if a >= start and b <= end]
    if not gaps:
        raise ValueError("decode_step: the requests never decoded together")
    return statistics.median(gaps)


def engine_profile(num_blocks: int | None, block_size: int | None, max_num_seqs: int,
                   max_num_batched_tokens: int) -> dict:
    """The calibration's ``engine`` (the simulator's CPU defaults) for a vLLM server: its KV
    pool in the simulator's 16-token blocks, no host tier or store, its scheduler limits."""
    if not num_blocks or not block_size:
        raise ValueError("vLLM's /metrics has no vllm:cache_config_info (num_gpu_blocks, block_size)")
    return {"l1_blocks": num_blocks * block_size // SIM_BLOCK, "l2_blocks": 0, "l3_gib": 0.0,
            "block_size": block_size, "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens, "cores": os.cpu_count() or 1}


def calibration(prof: StepProfile, kv_bytes_per_token: int, engine: dict, l3_gbps: float = 0.67,
                network_gbps: float = 1.0):
    """The fitted step model and the calibration file's content (``warmpath calibrate``'s
    format, ``calibrate/fit.fitted``) for a vLLM server's timed steps and ``engine``."""
    from warmpath.calibrate.fit import fitted

    model, fit = fitted(prof, kv_bytes_per_token, l3_gbps, network_gbps)
    return model, {"calibrated_engine": "vllm", "engine": engine, **fit}


class Prober:
    """Timed requests to one vLLM server (greedy, ``ignore_eos``, streamed with usage)."""

    def __init__(self, url: str, model: str, vocab: int, seed: int = 0) -> None:
        self.url, self.model, self.vocab = url.rstrip("/"), model, vocab
        self.rng = np.random.default_rng(seed)
        self.http = httpx.Client(timeout=httpx.Timeout(600, connect=5))

    def ids(self, n: int) -> list[int]:
        return [int(x) for x in self.rng.integers(100, self.vocab - 100, n)]

    def run(self, prompt: list[int], max_tokens: int) -> tuple[list[float], dict]:
        """Token arrival times (seconds after sending) and vLLM's usage."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        times, usage, t0 = [], None, time.monotonic()
        with self.http.stream("POST", self.url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"vLLM at {self.url} answered {r.status_code}: {r.read()[:300]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                d = json.loads(line[6:])
                c = (d.get("choices") or [{}])[0]
                if c.get("text") or c.get("finish_reason"):
                    times.append(time.monotonic() - t0)
                elif isinstance(d.get("usage"), dict):
                    usage = d["usage"]
        if not times or usage is None:
            raise RuntimeError(f"vLLM at {self.url} streamed no token or no usage")
        return times, usage

    def prefill(self, contexts, tokens) -> list[tuple[int, int, float]]:
        rows = []
        for c in contexts:
            ctx = self.ids(c)
            for prompt in [ctx] + [ctx + self.ids(t) for t in tokens] + [ctx + self.ids(1)]:
                times, usage = self.run(prompt, 1)
                rows.append(prefill_row(usage, times[0]))
        return rows

    def decode(self, contexts, batches, decode_tokens: int) -> list[tuple[int, int, float]]:
        rows = []
        for c in contexts:
            ctx = self.ids(c)
            self.run(ctx, 1)                                       # cached: the batches share it
            for b in batches:
                with cf.ThreadPoolExecutor(b) as pool:
                    runs = list(pool.map(lambda p: self.run(p, decode_tokens), [ctx + self.ids(1) for _ in range(b)]))
                rows.append((b, c + 1 + decode_tokens // 2, decode_step([t for t, _ in runs])))
        return rows

    def metrics(self):
        from warmpath.vllm.load import parse_metrics

        return parse_metrics(self.http.get(self.url + "/metrics", timeout=10).text)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError as e:
        raise ValueError(f"{flag}: expected comma-separated counts, got {text!r}") from e
    if not out or min(out) < 1:
        raise ValueError(f"{flag}: counts must be >= 1, got {text!r}")
    return out


def points(a: argparse.Namespace, max_num_seqs: int) -> dict:
    """What to time, from the flags (``--quick``: fewer points); ``ValueError`` naming a bad flag."""
    pts = {"contexts": (64, 256) if a.quick else _ints(a.contexts, "--contexts"),
           "tokens": (16, 64) if a.quick else _ints(a.tokens, "--tokens"),
           "batches": (1, 4) if a.quick else _ints(a.batches, "--batches"),
           "decode_tokens": 8 if a.quick else a.decode_tokens}
    if max(pts["batches"]) > max_num_seqs:
        raise ValueError(f"--batches: {max(pts['batches'])} sequences exceed the server's max_num_seqs {max_num_seqs}")
    if pts["decode_tokens"] < 4:
        raise ValueError(f"--decode-tokens must be >= 4, got {a.decode_tokens}")
    return pts


def measure(p: Prober, pts: dict) -> StepProfile:
    """The timed steps at ``pts`` (:func:`points`)."""
    p.run(p.ids(32), 2)                                            # warm up (first-request costs)
    pre = p.prefill(pts["contexts"], pts["tokens"])
    print(f"prefill: {len(pre)} steps timed", flush=True)
    dec = p.decode(pts["contexts"], pts["batches"], pts["decode_tokens"])
    print(f"decode: {len(dec)} batches timed", flush=True)
    return StepProfile(pre, dec, [])


def main(a: argparse.Namespace) -> int:
    """Start (or reach) the vLLM server, time it, write the calibration to ``--out``."""
    from warmpath.calibrate.fit import print_fit
    from warmpath.cli_args import serve_namespace
    from warmpath.models.files import model_config
    from warmpath.vllm.worker import KV_ITEMSIZE

    w = serve_namespace(["--engine", "vllm", "--model", a.model, *shlex.split(a.serve_args)])
    mcfg = model_config(a.model)
    batched = _flag_int(w.vllm_args, "--max-num-batched-tokens", VLLM_CPU_BATCHED_TOKENS)
    pts = points(a, w.max_num_seqs)
    server, url = (None, a.url) if a.url else _start(w)
    try:
        try:
            served = httpx.get(url.rstrip("/") + "/v1/models", timeout=10).json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            raise ValueError(f"--url {url}: not a vLLM OpenAI server that answers /v1/models ({e})") from e
        p = Prober(url, served, mcfg.vocab_size)
        m = p.metrics()
        prof = measure(p, pts)
    finally:
        if server is not None:
            server.stop()
    kvb = mcfg.kv_bytes_per_token(KV_ITEMSIZE.get(w.dtype, 2))
    model, out = calibration(prof, kvb, engine_profile(m.num_blocks, m.block_size, w.max_num_seqs, batched),
                             a.l3_gbps, a.network_gbps)
    out.update(model=served, vllm_url=None if server else url)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print_fit(model)
    print(f"wrote {a.out} ({len(out['ppd_table'])} PPD cells; vLLM KV pool {m.kv_tokens} tokens)")
    return 0


def _flag_int(args: str | None, flag: str, default: int) -> int:
    """``flag``'s value in a shell-quoted flag string (``--vllm-args``), else ``default``."""
    words = shlex.split(args or "")
    for i, x in enumerate(words):
        if x == flag and i + 1 < len(words):
            return int(words[i + 1])
        if x.startswith(flag + "="):
            return int(x.split("=", 1)[1])
    return default


def _start(w: argparse.Namespace):
    """A vLLM server as ``warmpath worker --engine vllm`` starts it (nothing subscribes to its
    events here); returns it, answering, and its URL."""
    from warmpath.models.files import served_model_id
    from warmpath.procs import free_port
    from warmpath.vllm.model_dir import vllm_model_dir
    from warmpath.vllm.server import VLLMServer
    from warmpath.vllm.worker import server_config, vllm_block_size

    mdir = vllm_model_dir(w.model)
    w.block_size = vllm_block_size(w.block_size)
    cfg = server_config(w, mdir, served_model_id(w.model), f"tcp://127.0.0.1:{free_port()}", None)
    server = VLLMServer(cfg, Path(w.vllm_log) if w.vllm_log else None).start()
    try:
        print(f"starting vLLM: {shlex.join(cfg.argv())}", flush=True)
        print(f"vLLM ready in {server.wait_ready():.0f} s at {cfg.url}", flush=True)
    except BaseException:
        server.stop()
        raise
    return server, cfg.url

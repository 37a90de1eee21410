"""``warmpath worker --engine vllm``: a vLLM server supervised behind warmpath's router.

Order: the event relay binds (so vLLM's PUB has somewhere to connect) → vLLM starts and
answers (~100 s on CPU) → the HTTP face serves, registers with the router like warmpath's
workers (role, namespace, KV events of the relay, capacity: vLLM's ``max_num_seqs`` and its
KV pool in tokens from ``/metrics``) and heartbeats the load read from vLLM's ``/metrics``.
If vLLM exits, the worker tells the router (``healthy=False``) and exits 1, so a supervisor
(``warmpath serve``) restarts it; on SIGTERM it stops vLLM's process group, then itself.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import shlex
import signal
import socket
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from warmpath.kv.hashing import KVNamespace
from warmpath.models.files import model_config
from warmpath.models.generation import read_generation_config, resolve_defaults, table_entry
from warmpath.models.tokenizer import TextTokenizer
from warmpath.procs import free_port
from warmpath.protocol.internal import Registration
from warmpath.vllm.app import FrontConfig, build_vllm_front
from warmpath.vllm.connector import buffer_device, check_role, connector_env, kv_transfer_config
from warmpath.vllm.event_relay import EventRelay
from warmpath.vllm.load import RelayBook, parse_metrics
from warmpath.vllm.model_dir import vllm_model_dir
from warmpath.vllm.relay import vllm_defaults
from warmpath.vllm.server import VLLMServer, VLLMServerConfig

log = logging.getLogger(__name__)
KV_ITEMSIZE = {"float32": 4, "auto": 2, "bfloat16": 2, "float16": 2, "half": 2}


def cpu_string(cpus) -> str:
    """CPU ids as VLLM_CPU_OMP_THREADS_BIND writes them: ``{0, 1, 2, 5}`` → ``"0-2,5"``."""
    ids, runs = sorted(cpus), []
    for c in ids:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def server_config(a: argparse.Namespace, model_dir: Path, model_id: str, events: str, replay: str,
                  side_host: str = "127.0.0.1", side_port: int | None = None) -> VLLMServerConfig:
    """The vLLM server's settings from ``warmpath worker`` flags; with ``--vllm-kv-connector``
    its ``--kv-transfer-config`` and the connector's side channel on ``side_host:side_port``
    (the host the decode side reaches; ``None``: a free port)."""
    check_role(a.role, a.vllm_kv_connector)
    kv = 1 if a.kv_cache_gib == "auto" else a.kv_cache_gib
    if kv != int(kv):
        raise ValueError(f"--kv-cache-gib for vLLM is a whole number of GiB (VLLM_CPU_KVCACHE_SPACE), got {kv}")
    env = {"VLLM_LOGGING_LEVEL": "INFO" if a.log_level.upper() in ("DEBUG", "INFO") else "WARNING"}
    extra = tuple(shlex.split(a.vllm_args or ""))
    if a.vllm_kv_connector:
        kvt = kv_transfer_config(a.vllm_kv_connector, a.role, buffer_device(a.vllm_kv_buffer_device))
        env |= connector_env(kvt, side_host, side_port or free_port())
        extra = ("--kv-transfer-config", json.dumps(kvt, separators=(",", ":")), *extra)
    return VLLMServerConfig(
        model_dir=str(model_dir), served_model_name=model_id, port=a.vllm_port or free_port(),
        events_endpoint=events, replay_endpoint=replay, python=a.vllm_python,
        command=tuple(shlex.split(a.vllm_command)) if a.vllm_command else (), block_size=a.block_size,
        max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len, dtype=a.dtype, kv_cache_gib=int(kv),
        threads_bind=a.vllm_cpus or cpu_string(os.sched_getaffinity(0)), extra_args=extra, env=env,
        startup_timeout_s=a.vllm_startup_s)


def vllm_block_size(block_size: int) -> int:
    """vLLM's CPU attention takes block sizes that are multiples of 32 (``No common block size
    for 16 (CPU_ATTN: [MultipleOf(32)])``): others are rounded up, with a warning. The router
    hashes prompts with the block size the worker registers, so keys still match."""
    if block_size <= 0:
        raise ValueError(f"--block-size must be > 0, got {block_size}")
    if block_size % 32:
        up = -(-block_size // 32) * 32
        log.warning("--block-size %d: vLLM's CPU attention needs a multiple of 32; using %d", block_size, up)
        return up
    return block_size


def namespace(model_id: str, model_dir: Path, dtype: str, block_size: int) -> KVNamespace:
    """The KV namespace a vLLM worker registers: its own revision and dtype labels (its KV is
    vLLM's, not interchangeable with warmpath's engine), the model's tokenizer identity."""
    tok = TextTokenizer.from_dir(model_dir)
    return KVNamespace(model_id=model_id, revision=f"vllm:{model_dir.name}", dtype=f"vllm-{dtype}",
                       block_size=block_size, tokenizer=tok.identity)


def _bind(a: argparse.Namespace) -> socket.socket | None:
    """``--port 0``: bind a free port now (so it can be advertised) and put it in ``a.port``."""
    if a.port != 0:
        return None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((a.host, 0))
    a.port = sock.getsockname()[1]
    return sock


def _registration(a, ns: KVNamespace, url: str, mcfg, max_len: int, relay: EventRelay, defaults, kv_tokens,
                  scfg: VLLMServerConfig) -> dict:
    """What this worker tells the router: namespace, events, defaults and capacity (vLLM's)."""
    return Registration(
        worker_id=a.worker_id, role=a.role, url=url, namespace=dataclasses.asdict(ns), engine="vllm", pid=os.getpid(),
        kv_bytes_per_token=mcfg.kv_bytes_per_token(KV_ITEMSIZE.get(a.dtype, 2)), max_model_len=max_len,
        events_endpoint=relay.pub.endpoint, replay_endpoint=relay.pub.replay_endpoint,
        generation_defaults=defaults.to_json(), max_num_seqs=a.max_num_seqs,
        kv_capacity_tokens=kv_tokens, prefill_chunk_tokens=scfg.batched_tokens()).model_dump()


def _serve_front(a, app, server: VLLMServer, metrics_url: str, reg, body: dict | None, book: RelayBook,
                 sock: socket.socket | None) -> bool:
    """Run the worker's HTTP face until SIGTERM or vLLM's death (then reported unhealthy);
    ``True`` when vLLM died."""
    import uvicorn

    from warmpath.worker.registration import keep_registered, report_unhealthy

    userver = uvicorn.Server(uvicorn.Config(app, host=a.host, port=a.port, log_level=a.log_level.lower(),
                                            timeout_graceful_shutdown=10))
    died = {"v": False}

    async def heartbeat():
        async with httpx.AsyncClient(timeout=5) as http:
            return book.heartbeat(a.worker_id, parse_metrics((await http.get(metrics_url)).text))

    async def watch() -> None:
        while server.alive:
            await asyncio.sleep(0.5)
        died["v"] = True
        log.error("the vLLM server exited (code %s); reporting unhealthy and exiting", server.proc.returncode)
        if reg is not None:
            await report_unhealthy(reg, f"vLLM server exited with code {server.proc.returncode}")
        userver.should_exit = True

    @asynccontextmanager
    async def lifespan(_app):
        tasks = [asyncio.create_task(watch())]
        if reg is not None:
            tasks.append(asyncio.create_task(keep_registered(reg, body, heartbeat, lambda: server.alive)))
        yield
        for t in tasks:
            t.cancel()
        await app.state.http.aclose()

    app.router.lifespan_context = lifespan
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # uvicorn's own handler from here on
    userver.run(sockets=[sock] if sock is not None else None)
    return died["v"]


def run(a: argparse.Namespace, model_id: str, advertise: str) -> int:
    """Start vLLM, serve until SIGTERM / vLLM's death; the exit code."""
    from warmpath.launch.netaddr import url_host
    from warmpath.worker.registration import RegistrationConfig

    stop = {"sig": False}
    sock = _bind(a)

    def on_term(*_):   # while vLLM starts: leave through the finally below
        stop["sig"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    mdir = vllm_model_dir(a.model)
    a.block_size = vllm_block_size(a.block_size)
    ns = namespace(model_id, mdir, a.dtype, a.block_size)
    mcfg = model_config(a.model)
    max_len = min(a.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings)
    relay = EventRelay(ns, a.worker_id, host=a.host, port=a.kv_events_port, advertise_host=advertise,
                       token=a.cluster_token)
    scfg = server_config(a, mdir, model_id, relay.vllm_endpoint, f"tcp://127.0.0.1:{free_port()}", advertise)
    server = VLLMServer(scfg, Path(a.vllm_log) if a.vllm_log else None)
    try:
        log.info("starting vLLM: %s", shlex.join(scfg.argv()))
        server.start()
        took = server.wait_ready(lambda: stop["sig"])
        relay.start()
        m = parse_metrics(httpx.get(scfg.url + "/metrics", timeout=5).text)
        if m.block_size not in (None, a.block_size):
            raise RuntimeError(f"vLLM runs block size {m.block_size}, not --block-size {a.block_size}: "
                               "its events could not be re-keyed")
        # what vLLM itself applies (relay.vllm_defaults): the override and the model's files, not the model table
        defaults = vllm_defaults(resolve_defaults(a.override_generation_config, read_generation_config(mdir),
                                                  table_entry(model_id), a.default_max_tokens))
        url = f"http://{url_host(advertise)}:{a.port}"
        body = _registration(a, ns, url, mcfg, max_len, relay, defaults, m.kv_tokens, scfg)
        book = RelayBook()
        fcfg = FrontConfig(vllm_url=scfg.url, model=model_id, max_model_len=max_len, defaults=defaults,
                           aliases=(a.model,), vllm_pid=server.proc.pid, max_body_bytes=int(a.max_body_mib * (1 << 20)),
                           cluster_token=a.cluster_token, api_keys=tuple(a.api_key),
                           kv_connector=bool(a.vllm_kv_connector))
        app = build_vllm_front(fcfg, lambda: server.alive, relay.stats, book, relay.cached)
        reg = RegistrationConfig(a.router.rstrip("/"), a.worker_id, a.role, url, a.heartbeat_s,
                                 cluster_token=a.cluster_token) if a.router else None
        print(f"warmpath: vLLM worker {a.worker_id} ({model_id}, vLLM ready in {took:.0f} s at {scfg.url}) "
              f"on {url}", flush=True)
        return 1 if _serve_front(a, app, server, scfg.url + "/metrics", reg, body, book, sock) else 0
    except KeyboardInterrupt:
        return 0 if stop["sig"] else 130
    finally:
        server.stop()
        relay.close()

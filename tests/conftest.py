"""Shared fixtures: the real SmolLM2 model, free ports, real server processes, Mooncake."""

import contextlib
import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import sys
import time

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

# The cluster token of every process these fixtures start (unless a test's env names another):
# tests send AUTH to a worker's /internal/* and to read worker PIDs/URLs from /v1/cluster.
CLUSTER_TOKEN = os.environ.setdefault("WARMPATH_TEST_CLUSTER_TOKEN", secrets.token_urlsafe(24))
AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}


@pytest.fixture(scope="session")
def smollm():
    from warmpath.models.loader import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def served_model():
    """SmolLM2 as ``warmpath worker`` serves it by default (``--quantization auto``): the
    reference for answers that come from running workers."""
    from warmpath.models.loader import load_model

    return load_model("smollm2", quantization="auto")


@pytest.fixture(scope="session")
def tiny():
    from warmpath.models.loader import load_model

    return load_model("tiny", seed=0)


def served_params(loaded, max_tokens: int, **given):
    """The ``SamplingParams`` a worker without ``--override-generation-config`` runs for a
    request that sets ``given`` (the model's defaults fill in the rest, as on a worker)."""
    from warmpath.engine.sequence import SamplingParams
    from warmpath.models.generation import resolve_defaults, table_entry

    d = resolve_defaults({}, loaded.generation_config, table_entry(loaded.model_id), 1024, loaded.generation_source)
    return SamplingParams(max_tokens=max_tokens, **{**d.sampling(), **given})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mooncake():
    """A private Mooncake master + 256 MiB segment holder on free loopback ports."""
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    from warmpath.kv.mooncake_service import MooncakeService

    with MooncakeService(segment_bytes=256 << 20) as svc:
        yield svc


REPEAT_TERM_S = 0.3   # stop_groups: when a group still running gets its second SIGTERM


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL after ``timeout``, then anything left."""
    stop_groups([proc], timeout)


def stop_groups(procs: list[subprocess.Popen], timeout: float) -> None:
    """``stop_group`` for several processes at once: SIGTERM every group first, so their
    shutdowns overlap; a group still there after ``REPEAT_TERM_S`` gets a second SIGTERM,
    which stops a draining worker at once (uvicorn's usual stop: worker/drain.py; a test's
    teardown need not wait out the drain's quiet second, tests/worker/test_drain.py checks
    the drain). Then wait for each (``timeout`` each at most), SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + REPEAT_TERM_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
            os.killpg(proc.pid, signal.SIGKILL)


POLL_S = 0.1    # how often a wait for a started process asks it (a local HTTP GET: cheap)


def wait_ready(proc: subprocess.Popen, ready, timeout: float, output) -> None:
    """Poll ``ready()`` until true; raise with ``output()`` if ``proc`` exits, or on timeout."""
    import httpx

    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited: {output()}")
        try:
            if ready():
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if time.time() > deadline:
            raise RuntimeError(f"not ready after {timeout:.0f} s")
        time.sleep(POLL_S)


@dataclasses.dataclass
class Server:
    """One ``warmpath serve`` / ``router`` / ``worker`` process for ``serve_processes``."""

    args: tuple
    command: str = "serve"
    port: int | None = None
    procs: list | None = None
    env: dict | None = None
    timeout: float = 120


def server(*args: str, command: str = "serve", port: int | None = None, procs: list | None = None,
           env: dict | None = None, timeout: float = 120) -> Server:
    """A process ``serve_processes`` starts: ``warmpath COMMAND ARGS`` on ``port`` (a free one
    when not given); its ``Popen`` is appended to ``procs`` when given, for tests that kill it."""
    return Server(args, command, port, procs, env, timeout)


@contextlib.contextmanager
def serve_processes(*servers: Server):
    """Run several real processes (``server(...)``) side by side: all are started at once, so
    their start-ups (imports, model load) overlap instead of queueing, then each is waited for
    until its ``/health`` answers; yields their URLs in order. A worker that starts before its
    router registers as soon as the router answers (it retries). All are stopped at once."""
    import httpx

    started = []
    try:
        for s in servers:
            port = s.port or free_port()
            extra = ["--threads", "2"] if s.command in ("serve", "worker") else []
            proc = subprocess.Popen(
                [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", s.command, "--host", "127.0.0.1",
                 "--port", str(port), *extra, *s.args],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                env={**os.environ, "WARMPATH_CLUSTER_TOKEN": CLUSTER_TOKEN, **(s.env or {})})
            if s.procs is not None:
                s.procs.append(proc)
            started.append((proc, f"http://127.0.0.1:{port}", s))
        with httpx.Client(timeout=1) as http:   # one client: httpx.get builds an SSL context (~30 ms CPU) per call
            for proc, base, s in started:
                wait_ready(proc, lambda: http.get(base + "/health").status_code == 200,
                           s.timeout, lambda: proc.stdout.read())
        yield [base for _, base, _ in started]
    finally:
        stop_groups([proc for proc, _, _ in started], 15)


@contextlib.contextmanager
def serve_process(*args: str, timeout: float = 120, command: str = "serve", port: int | None = None,
                  procs: list | None = None, env: dict | None = None):
    """Run ``warmpath serve`` (or ``router``) as a real process on a free port; yields its URL
    (and appends the ``Popen`` to ``procs`` when given, for tests that kill it). Several
    processes of one test: ``serve_processes``, which starts them side by side."""
    with serve_processes(server(*args, command=command, port=port, procs=procs, env=env, timeout=timeout)) as (base,):
        yield base


@contextlib.contextmanager
def cluster_process(topology: str, *args: str, timeout: float = 240, env: dict | None = None,
                    logs: list | None = None):
    """Run ``warmpath serve --topology T`` (router + workers + Mooncake as processes) on a free
    port; yields the router URL once every worker of the topology is registered (``logs``:
    gets the file their output goes to; read it with ``os.pread``, which leaves its offset)."""
    import httpx

    from warmpath.launch.topology import resolve

    size = resolve(topology).size
    port = free_port()
    log = tempfile.TemporaryFile("w+")   # a file, not a pipe: a full pipe would stall the workers
    proc = subprocess.Popen(
        [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", topology,
         "--host", "127.0.0.1", "--port", str(port), "--heartbeat-s", "1", "--drop-after-s", "10",
         "--l3-gib", "0.5", "--kv-cache-gib", "0.25", "--l2-gib", "0.25", *args],
        stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "WARMPATH_CLUSTER_TOKEN": CLUSTER_TOKEN, **(env or {})})
    if logs is not None:
        logs.append(log)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=2, headers=AUTH) as http:   # one client: see serve_processes
            wait_ready(proc, lambda: len(http.get(base + "/v1/cluster").json()["workers"]) == size,
                       timeout, lambda: (log.seek(0), log.read()[-4000:])[1])
        yield base
    finally:
        stop_group(proc, 30)
        log.close()


def metric(base: str, name: str, **labels) -> float | None:
    """One sample from a server's /metrics (labels must match exactly those given)."""
    import httpx

    from warmpath.bench.prom import sample_value

    return sample_value(httpx.get(base + "/metrics", timeout=10).text, name, **labels)


def wait_for(pred, timeout: float, tolerate: tuple = ()):
    """``pred()``'s first true value, polled every 50 ms; ``AssertionError`` after ``timeout``
    seconds. ``tolerate``: exceptions that count as "not yet" (a process still starting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if got := pred():
                return got
        except tolerate:
            pass
        time.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout} s")


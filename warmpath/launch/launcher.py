"""``warmpath serve --topology NAME``: Mooncake, the router and the workers as processes.

Starts a private Mooncake master + store (unless ``--kv-store`` names one), the router on
the requested port, then every worker on a free loopback port; waits until all workers
have registered, prints the endpoint, and stops everything on Ctrl-C / SIGTERM (children
also die with the launcher through ``PR_SET_PDEATHSIG``). A worker that exits while the
cluster runs (its engine failed, it was killed) is started again with the same flags, after
a back-off that doubles with each quick failure (1 s up to 30 s); so are the private Mooncake
master and segment holder, on the same ports (workers reconnect on their own).

``--routers N`` (N > 1) starts N routers, active-active, on free ports, each a ``--peer``
of the others, every worker reporting to all of them, and HAProxy on the requested port in
front (``launch/balancer.py``); a router that exits is started again like a worker.

Every process gets the cluster token (``--cluster-token`` / ``WARMPATH_CLUSTER_TOKEN``, or a
random one made here) through its environment, never its argv (argv shows in ``ps``); the
API keys go to the router only, the same way.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from warmpath.protocol.auth import API_KEY_ENV, CLUSTER_TOKEN_ENV

import httpx

from warmpath.launch.balancer import Balancer
from warmpath.launch.routers import is_router, spawn_routers
from warmpath.launch.topology import Topology, pinning
from warmpath.procs import die_with_parent

log = logging.getLogger(__name__)


@dataclass
class Cluster:
    """The processes of one running topology."""

    topology: Topology
    url: str
    procs: dict = field(default_factory=dict)     # name -> Popen
    service: object | None = None
    argv: dict = field(default_factory=dict)      # name -> the flags it was started with
    quiet: bool = True
    restarts: dict = field(default_factory=dict)  # name -> how many times it was restarted
    _delay: dict = field(default_factory=dict)    # name -> its last back-off (s)
    _due: dict = field(default_factory=dict)      # name -> when its restart is due
    token: str | None = field(default=None, repr=False)      # the cluster token of every process
    api_keys: tuple = field(default=(), repr=False)          # the router's API keys
    pins: dict = field(default_factory=dict)      # name -> the CPUs it is pinned to (topology's cpus)
    router_urls: tuple = ()                       # several routers: each one's own URL (url is the balancer's)
    balancer: Balancer | None = None

    @property
    def headers(self) -> dict[str, str]:
        """What reads ``/v1/cluster`` in full (worker PIDs and URLs) and calls ``/internal/*``
        is an API key when there are any, else the cluster token."""
        secret = self.api_keys[0].partition("=")[0] if self.api_keys else self.token
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    @property
    def routers(self) -> list[str]:
        """The router processes' names."""
        return [n for n in self.procs if is_router(n)]

    def stop(self) -> None:
        for name in sorted(self.procs, key=is_router):   # workers first
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.balancer is not None:
            self.balancer.stop()
        if self.service is not None:
            self.service.stop()

    def dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is not None]

    def spawn(self, name: str, argv: list[str]) -> None:
        self.argv[name] = argv
        env = {CLUSTER_TOKEN_ENV: self.token} if self.token else {}
        env[API_KEY_ENV] = ",".join(self.api_keys) if is_router(name) else ""   # workers: none
        self.procs[name] = _spawn(argv, self.quiet, env, self.pins.get(name))

    def restart_dead_workers(self, now: float) -> list[str]:
        """Start again every worker that exited (and, with several routers, every router)
        once its back-off passed (1 s, doubling up to 30 s while it keeps failing within a
        minute of its start); returns the names restarted now."""
        started = []
        for name in self.dead():
            if name == "router":   # the only router: the cluster stops with it
                continue
            if name not in self._due:   # just noticed
                ran = now - getattr(self.procs[name], "started_at", now)
                prev = self._delay.get(name, 0.0)
                self._delay[name] = 1.0 if ran > 60 or not prev else min(30.0, 2 * prev)
                self._due[name] = now + self._delay[name]
                log.error("%s %s exited with code %s; restarting it in %.0f s", "router" if is_router(name) else "worker",
                          name, self.procs[name].returncode, self._delay[name])
            elif now >= self._due[name]:
                del self._due[name]
                self.spawn(name, self.argv[name])
                self.restarts[name] = self.restarts.get(name, 0) + 1
                started.append(name)
        return started

    def restart_dead_store(self, now: float) -> list[str]:
        """Start again the private Mooncake master / segment holder if either exited (same
        ports, so workers and router keep their ``--kv-store``); at most one try a second.
        Returns what was restarted ("master", "holder")."""
        if self.service is None or not self.service.dead() or now < self._due.get("store", 0.0):
            return []
        self._due["store"] = now + 1.0
        log.error("Mooncake %s exited; restarting it", " and ".join(self.service.dead()))
        try:
            return self.service.restart_dead()
        except (OSError, RuntimeError) as e:
            log.error("could not restart Mooncake (%s); trying again", e)
            return []


# Mooncake's client logs expected lookup misses as errors when it starts; not worth a user's eye.
_NOISE = ("Logging before InitGoogleLogging", "metadata not found")


def _copy_stderr(pipe) -> None:
    for line in iter(pipe.readline, b""):
        if not any(n.encode() in line for n in _NOISE):
            sys.stderr.buffer.write(line)
            sys.stderr.flush()


def _spawn(args: list[str], quiet: bool, env: dict | None = None, cpus: frozenset | None = None) -> subprocess.Popen:
    """``warmpath ARGS`` as a child that dies with this process, pinned to ``cpus`` (before
    it runs anything, so its threads inherit the mask) when given."""
    env = {**os.environ, "MC_LOG_LEVEL": os.environ.get("MC_LOG_LEVEL", "ERROR"), **(env or {})}

    def pre() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    p = subprocess.Popen([sys.executable, "-m", "warmpath.cli", *args], env=env,
                         stdout=subprocess.DEVNULL if quiet else None, stderr=subprocess.PIPE,
                         preexec_fn=pre)
    p.started_at = time.monotonic()
    threading.Thread(target=_copy_stderr, args=(p.stderr,), daemon=True).start()
    return p


def start(topo: Topology, host: str, port: int, worker_argv: list[str], router_argv: list[str],
          kv_store: str | None, l3_gib: float, threads: int | None, log_level: str = "WARNING",
          timeout_s: float = 300.0, token: str | None = None, api_keys: tuple = (), routers: int = 1) -> Cluster:
    """Start everything and wait until every worker is registered (with every router);
    raises ``RuntimeError`` (after stopping what started) when a process dies or the wait
    times out. Without a ``token`` a random one secures this cluster's own processes
    (``Cluster.headers``). ``topo.cpus`` pins processes (checked against this machine
    first, ``ValueError`` naming an unknown CPU); a pinned worker's ``--threads`` is its CPU
    count unless ``threads``. ``routers`` > 1: that many routers behind HAProxy."""
    pins = pinning(topo)
    service = None
    if kv_store is None and l3_gib > 0:
        from warmpath.kv.mooncake_service import MooncakeService

        service = MooncakeService(host="127.0.0.1", segment_bytes=int(l3_gib * (1 << 30))).start()
        kv_store = f"{service.master},{service.metadata}"
    url = f"http://{host}:{port}"
    logging.getLogger("httpx").setLevel(logging.WARNING)
    c = Cluster(topo, url, service=service, quiet=log_level.upper() not in ("DEBUG", "INFO"),
                token=token or secrets.token_urlsafe(32), api_keys=tuple(api_keys), pins=pins)
    try:
        argv = ["--route-policy", topo.policy, "--ppd", topo.ppd, *router_argv]
        if routers > 1:
            c.balancer = spawn_routers(c, routers, host, port, log_level, argv)
        else:
            c.spawn("router", ["--log-level", log_level, "router", "--host", host, "--port", str(port), *argv])
        url = ",".join(c.router_urls) or url
        per = threads or max(1, (os.cpu_count() or 2) // topo.size)
        store = ["--kv-store", kv_store] if kv_store else ["--no-l3"]
        for wid, role in topo.roles():
            n = threads or (len(pins[wid]) if wid in pins else per)
            engine = ["--engine", topo.engines[role]] if role in topo.engines else []
            c.spawn(wid, ["--log-level", log_level, "worker", "--role", role, "--router", url,
                          "--worker-id", wid, "--host", "127.0.0.1", "--port", "0",
                          "--threads", str(n), *store, *worker_argv, *engine])
        wait_ready(c, timeout_s)
    except BaseException:
        c.stop()
        raise
    return c


def wait_ready(c: Cluster, timeout_s: float) -> None:
    """Until every worker is registered with every router (and the balancer answers)."""
    want = {w for w, _ in c.topology.roles()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if c.dead() or (c.balancer is not None and c.balancer.poll() is not None):
            raise RuntimeError(f"process(es) {c.dead() or ['haproxy']} exited during startup (see their output above)")
        try:
            if all(want <= {w["worker_id"] for w in httpx.get(u + "/v1/cluster", timeout=2,
                                                              headers=c.headers).json()["workers"]}
                   for u in (*c.router_urls, c.url)):
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"workers not registered after {timeout_s:.0f} s")


def run_forever(c: Cluster, model_id: str) -> int:
    """Print the endpoint, then wait for Ctrl-C / SIGTERM or a process dying."""
    roles = ", ".join(f"{n} {r}" for r, n in c.topology.workers.items() if n)
    print(f"warmpath: serving {model_id} ({c.topology.name}: {roles}; policy {c.topology.policy}, "
          f"PPD {c.topology.ppd}) on {c.url}/v1\n"
          f"  cluster: curl {c.url}/v1/cluster   metrics: curl {c.url}/metrics\n"
          f"  try: curl {c.url}/v1/chat/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{model_id}\", \"messages\": [{{\"role\": \"user\", "
          f"\"content\": \"What is the capital of France?\"}}]}}'", flush=True)
    stop = {"sig": None}

    def on_signal(sig, _frame) -> None:
        stop["sig"] = sig

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while stop["sig"] is None:
            if "router" in c.dead():
                log.error("the router exited; stopping the cluster")
                return 1
            if c.balancer is not None and c.balancer.poll() is not None:
                log.error("HAProxy exited; stopping the cluster")
                return 1
            for name in c.restart_dead_workers(time.monotonic()):
                print(f"warmpath: restarted {'router' if is_router(name) else 'worker'} {name} "
                      f"(restart {c.restarts[name]})", flush=True)
            for name in c.restart_dead_store(time.monotonic()):
                c.restarts[f"mooncake-{name}"] = c.restarts.get(f"mooncake-{name}", 0) + 1
                print(f"warmpath: restarted Mooncake {name}", flush=True)
            time.sleep(0.25)
        return 0
    finally:
        print("warmpath: stopping the cluster", flush=True)
        c.stop()


def serve_cluster(a, model_id: str) -> int:
    """``warmpath serve --topology NAME`` from its parsed flags: start, print, wait, stop."""
    return run_forever(start_from_args(a), model_id)


def start_from_args(a) -> Cluster:
    """Start the cluster ``warmpath serve --topology NAME`` describes (its parsed flags)."""
    from warmpath.launch.topology import resolve, with_pins
    from warmpath.routing.flags import routing_argv

    topo = with_pins(resolve(a.topology, a.ppd, getattr(a, "route_policy", None)), getattr(a, "pin", None))
    topo.check_handoff(a.engine, getattr(a, "vllm_kv_connector", None))
    if not getattr(a, "vllm_cpus", None):
        from warmpath.launch.topology import spread_vllm

        topo = spread_vllm(topo, a.engine)
    router_argv = ["--model", a.model, "--heartbeat-s", str(a.heartbeat_s), "--drop-after-s", str(a.drop_after_s),
                   "--session-idle-s", str(a.session_idle_s), "--max-body-mib", str(a.max_body_mib),
                   *routing_argv(a)]
    if a.calibration:
        router_argv += ["--calibration", a.calibration]
    from warmpath.protocol.auth import api_key_specs, cluster_token

    vllm = a.engine == "vllm" or "vllm" in topo.engines.values()
    return start(topo, a.host, a.port, worker_argv(a), router_argv, a.kv_store,
                 0 if a.no_l3 else a.l3_gib, a.threads,
                 log_level="INFO" if a.log_level.upper() == "DEBUG" else "WARNING",
                 timeout_s=a.vllm_startup_s + 60 if vllm else 300.0,
                 token=cluster_token(a.cluster_token), api_keys=api_key_specs(a.api_key), routers=a.routers)


def worker_argv(a) -> list[str]:
    """The engine flags of ``a`` as ``warmpath worker`` arguments (for the launcher)."""
    argv = ["--model", a.model, "--device", a.device, "--dtype", a.dtype, "--quantization", a.quantization,
            "--block-size", str(a.block_size), "--attention", a.attention, "--compile", a.compile,
            "--kv-cache-gib", str(a.kv_cache_gib), "--max-num-seqs", str(a.max_num_seqs),
            "--max-num-batched-tokens", str(a.max_num_batched_tokens), "--schedule-order", a.schedule_order,
            "--l2-gib", str(a.l2_gib), "--kv-protocol", a.kv_protocol, "--kv-load-mode", a.kv_load_mode,
            "--kv-l3-overlap", a.kv_l3_overlap, "--kv-dtype", a.kv_dtype,
            "--heartbeat-s", str(a.heartbeat_s), "--default-max-tokens", str(a.default_max_tokens),
            "--drain-timeout-s", str(a.drain_timeout_s),
            "--max-body-mib", str(a.max_body_mib)]
    argv += ["--no-chunked-prefill"] if a.no_chunked_prefill else []
    argv += ["--no-prefix-caching"] if a.no_prefix_caching else []
    argv += ["--max-model-len", str(a.max_model_len)] if a.max_model_len else []
    argv += ["--decode-threads", str(a.decode_threads)] if a.decode_threads else []
    argv += ["--kv-write-mode", a.kv_write_mode] if a.kv_write_mode else []
    argv += ["--step-trace", a.step_trace] if getattr(a, "step_trace", None) else []
    argv += ["--engine", a.engine, "--vllm-startup-s", str(a.vllm_startup_s)]
    argv += [f for k in ("vllm_python", "vllm_command", "vllm_args", "vllm_cpus", "vllm_kv_connector",
                         "vllm_kv_buffer_device") if getattr(a, k, None)
             for f in (f"--{k.replace('_', '-')}", getattr(a, k))]
    if a.override_generation_config:   # checked here already; the workers check it again
        argv += ["--override-generation-config", json.dumps(a.override_generation_config)]
    return argv

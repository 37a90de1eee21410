"""A Ray cluster over "hosts" for tests and measurements: one network namespace per node on
one bridge, a Ray head on the first, Ray worker nodes on the others.

Ray binds every interface of its host (GCS, raylets, object managers, actors' workers), so it
only ever runs inside namespaces made here: nothing of it is reachable from outside them.
Needs root and iproute2. Everything started lives in those namespaces, and teardown kills
every process in them (``ip netns pids``) before deleting them.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.launch.test_multihost import enter_netns, sh

REPO = Path(__file__).resolve().parents[2]


def skip_reason() -> str | None:
    """Why a Ray cluster cannot run here (``None``: it can)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2: Ray binds every interface, so it runs only inside network namespaces"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install -r requirements/ray.txt)"
    return None


class RayHosts:
    """Nodes ``{name: address}`` (the first is the head) on bridge ``prefix-br``."""

    def __init__(self, nodes: dict[str, str], cpus: dict[str, float], prefix: str = "wpr", port: int = 6379,
                 nice: int = 19):
        """``nice``: the Ray nodes' niceness, inherited by every process Ray starts (19 in
        tests; a measurement against ``warmpath serve`` gives both the same, 0)."""
        self.nodes, self.cpus, self.prefix, self.port, self.nice = nodes, cpus, prefix, port, nice
        self.ns = {n: f"{prefix}-{n}" for n in nodes}
        self.head = next(iter(nodes))
        self.address = f"{nodes[self.head]}:{port}"
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))   # short: Ray's socket paths must fit
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "MC_LOG_LEVEL": "ERROR",
                    "RAY_DEDUP_LOGS": "0"}
        self.procs: list[subprocess.Popen] = []
        self._pools: dict[str, cf.ThreadPoolExecutor] = {}

    def on(self, node: str, fn, *args, **kw):
        """Call ``fn`` on a thread inside ``node``'s namespace (its sockets live there)."""
        if node not in self._pools:
            self._pools[node] = cf.ThreadPoolExecutor(8, initializer=enter_netns, initargs=(self.ns[node],))
        return self._pools[node].submit(fn, *args, **kw).result()

    def pool(self, node: str) -> cf.ThreadPoolExecutor:
        self.on(node, lambda: None)
        return self._pools[node]

    def run(self, node: str, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        """A command in ``node``'s namespace, to its end."""
        return subprocess.run(["ip", "netns", "exec", self.ns[node], *argv], capture_output=True, text=True, check=False,
                              env=self.env, timeout=timeout)

    def deploy(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """``warmpath deploy --ray HEAD ARGS`` on the head node; an ``AssertionError`` with its
        output if it fails."""
        r = self.run(self.head, [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "deploy",
                                 "--ray", self.address, *args], timeout)
        assert r.returncode == 0, f"deploy {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
        return r

    def json(self, *args: str) -> dict:
        """``warmpath deploy`` ARGS's JSON answer (``--status``, ``--scale``)."""
        out = self.deploy(*args).stdout
        return json.loads(out[out.index("{"):])

    def status(self) -> dict:
        return self.json("--status")

    def _net_up(self) -> None:
        br = f"{self.prefix}-br"
        for name in [br, *self.ns.values()]:
            sh("ip", "netns", "add", name)
        sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", br, "link", "set", "br0", "up")
        for n, ns in self.ns.items():
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{n}", "netns", br)
            sh("ip", "-n", br, "link", "set", f"p{n}", "master", "br0")
            sh("ip", "-n", br, "link", "set", f"p{n}", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.nodes[n]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _ray_start(self, node: str) -> None:
        head = node == self.head
        where = ["--head", "--port", str(self.port), "--include-dashboard", "false"] if head else ["--address", self.address]
        log = open(self.tmp / f"ray-{node}.log", "w")  # noqa: SIM115 - the node outlives this call
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", self.ns[node], "nice", "-n", str(self.nice), sys.executable, "-m", "ray.scripts.scripts",
             "start", *where, "--node-ip-address", self.nodes[node], "--num-cpus", str(self.cpus.get(node, 1)),
             "--num-gpus", "0", "--object-store-memory", str(100 << 20), "--disable-usage-stats", "--temp-dir", str(self.tmp / node), "--block"],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    def alive_nodes(self) -> int:
        code = "import ray; ray.init(address='%s', logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))"
        r = self.run(self.head, [sys.executable, "-c", code % self.address], timeout=120)
        return int(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else 0

    def wait(self, pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if got := pred():
                return got
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout} s")

    def __enter__(self) -> RayHosts:  # noqa: PYI034
        try:
            self._net_up()
            self._ray_start(self.head)
            self.wait(lambda: self.alive_nodes() >= 1, 120, "Ray head up")
            for n in self.nodes:
                if n != self.head:
                    self._ray_start(n)
            self.wait(lambda: self.alive_nodes() == len(self.nodes), 180, f"{len(self.nodes)} Ray nodes alive")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for ns in self.ns.values():
                pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout.split()
                for pid in set(pids) - {str(os.getpid())}:   # (only this process's threads joined one)
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), sig)
            time.sleep(2 if sig == signal.SIGTERM else 0.5)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        for name in [*self.ns.values(), f"{self.prefix}-br"]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def log(self, node: str) -> str:
        return (self.tmp / f"ray-{node}.log").read_text()[-3000:]

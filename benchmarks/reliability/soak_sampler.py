"""The soak's sampler: a thread that, every few seconds, reads each process of the cluster
(RSS and open file descriptors from /proc) and the servers' gauges (Prometheus text parsed with
``prometheus_client.parser``): the router's sessions, KV index size per set, requests in flight
and waiting; each worker's KV blocks per tier and state and its running / waiting requests.

Series names: ``rss_mib/<process>``, ``fds/<process>``, ``kv_blocks/<worker>/<tier>/<state>``,
``index/<set>``, ``sessions``, ``load/<what>``, ``capacity/<worker>/<tier>`` (blocks; processes named as benchmarks/reliability/memory.py does:
``router``, ``worker decode-0``, ``mooncake_master``, ...).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from benchmarks.reliability.memory import MIB, name_of, tree
from warmpath.bench.prom import samples


def process(pid: int) -> tuple[str, float, int] | None:
    """``(name, RSS MiB, open fds)`` of one process; None when it is gone."""
    d = Path(f"/proc/{pid}")
    try:
        argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        rss = next(int(line.split()[1]) * 1024 for line in (d / "status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        fds = len(os.listdir(d / "fd"))
    except (OSError, StopIteration):
        return None
    return name_of(argv), rss / MIB, fds


def router_gauges(text: str) -> dict[str, float]:
    """The router's size and load gauges from its ``/metrics``."""
    out = {}
    for s in samples(text):
        if s.name == "warmpath_router_sessions":
            out["sessions"] = s.value
        elif s.name == "warmpath_router_index_blocks":
            out[f"index/{s.labels['set']}"] = s.value
        elif s.name in ("warmpath_router_in_flight", "warmpath_router_waiting"):
            out["load/router_" + s.name.removeprefix("warmpath_router_")] = s.value
    return out


def worker_gauges(worker: str, text: str) -> dict[str, float]:
    """One worker's KV blocks per tier and state, and its running / waiting requests."""
    out: dict[str, float] = {}
    for s in samples(text):
        if s.name == "warmpath_kv_tier_blocks" and s.labels["state"] == "capacity":
            out[f"capacity/{worker}/{s.labels['tier']}"] = s.value
        elif s.name == "warmpath_kv_tier_capacity_bytes":
            out[f"capacity_bytes/{worker}/{s.labels['tier']}"] = s.value
        elif s.name == "warmpath_kv_tier_blocks":
            out[f"kv_blocks/{worker}/{s.labels['tier']}/{s.labels['state']}"] = s.value
        elif s.name in ("warmpath_num_requests_running", "warmpath_num_requests_waiting"):
            key = f"load/{worker}_" + s.name.removeprefix("warmpath_num_requests_")
            out[key] = out.get(key, 0.0) + s.value
    return out


class Sampler(threading.Thread):
    """Samples the cluster below ``root_pid`` every ``every_s`` from ``t0`` (``perf_counter``)
    until :meth:`halt`; ``rows`` holds ``{"t": seconds, "values": {series: value}}``."""

    def __init__(self, root_pid: int, base: str, auth: dict, workers: dict[str, str], every_s: float,
                 t0: float, on_sample: Callable[[dict], None] | None = None) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.root_pid, self.base, self.workers, self.every_s, self.t0 = root_pid, base, workers, every_s, t0
        # NOTE: a fresh connection per scrape: the servers close idle keep-alive connections after
        # 5 s, and a sample period near that races them (a scrape on a connection being closed)
        self.http = httpx.Client(timeout=10, headers=auth, limits=httpx.Limits(max_keepalive_connections=0))
        self.on_sample = on_sample
        self.rows: list[dict] = []
        self.errors: list[str] = []
        self.pids: dict[str, set[int]] = {}       # process name -> every PID seen under it
        self._halt = threading.Event()

    def run(self) -> None:
        k = 0
        while not self._halt.is_set():
            row = self.sample()
            self.rows.append(row)
            if self.on_sample:
                self.on_sample(row)
            k += 1
            self._halt.wait(max(0.0, self.t0 + k * self.every_s - time.perf_counter()))

    def halt(self) -> None:
        """Stop the thread after the sample under way (if any); :meth:`sample` still works."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=30)

    def close(self) -> None:
        """Halt, and close the HTTP client."""
        self.halt()
        self.http.close()

    def sample(self) -> dict:
        """One sample of everything, now."""
        t = time.perf_counter() - self.t0
        values: dict[str, float] = {}
        for pid in tree(self.root_pid):
            got = process(pid)
            if got is None:
                continue
            name, rss, fds = got
            if f"rss_mib/{name}" in values:          # two processes with one name: tell them apart
                name = f"{name} ({pid})"
            self.pids.setdefault(name, set()).add(pid)
            values[f"rss_mib/{name}"], values[f"fds/{name}"] = rss, fds
        values.update(self._scrape("router", self.base, router_gauges))
        for w, url in self.workers.items():
            values.update(self._scrape(w, url, lambda text, w=w: worker_gauges(w, text)))
        return {"t": round(t, 2), "values": values}

    def _scrape(self, who: str, url: str, parse: Callable[[str], dict[str, float]]) -> dict[str, float]:
        """``parse`` of ``url``'s /metrics; {} (and an error noted) when it does not answer."""
        try:
            r = self.http.get(url + "/metrics")
            r.raise_for_status()
            return parse(r.text)
        except (httpx.HTTPError, ValueError) as e:
            self.errors.append(f"{time.perf_counter() - self.t0:.0f} s {who}: {type(e).__name__}: {e}")
            return {}


def series(rows: list[dict], until: float | None = None) -> dict[str, list[tuple[float, float]]]:
    """The rows as one ``(t, value)`` list per series (rows after ``until`` left out)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if until is None or row["t"] <= until:
            for k, v in row["values"].items():
                out.setdefault(k, []).append((row["t"], v))
    return out

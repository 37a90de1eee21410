"""The chaos run's faults (``benchmarks/reliability/chaos.py``): a seeded, bounded schedule and what
each fault does, with its detection and recovery times measured from the outside.

Kinds: ``kill`` (SIGKILL the busiest prefill-type worker; the launcher restarts it), ``stop``
(SIGSTOP a worker for ``--stop-s``, then SIGCONT), ``store`` (SIGKILL the Mooncake master and
segment holder; the launcher restarts them), ``corrupt`` (bit flips in stored L3 blocks
through ``/internal/fault`` ``l3-corrupt``), ``fill`` (junk past the store's segment through
``l3-fill``). A network cut is left out (see ``docs/reliability.md``).
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass, field

import httpx
import psutil

from warmpath.bench.prom import samples

KINDS = ("kill", "stop", "store", "corrupt", "fill")


@dataclass
class Fault:
    """One scheduled fault and what was measured (seconds from the fault)."""

    kind: str
    at: float                      # seconds after the load started
    target: str = ""
    fired: float | None = None     # monotonic time it happened
    result: dict = field(default_factory=dict)


def schedule(kinds: list[str], duration: float, seed: int, warmup: float = 25.0, tail: float = 100.0) -> list[Fault]:
    """The faults in a seeded order, spread over ``[warmup, duration - tail]`` with jitter."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    span = max(1.0, duration - warmup - tail) / max(1, len(order))
    out = []
    for i, k in enumerate(order):
        at = warmup + span * (i + rng.uniform(0.0, 0.3))
        target = {"kill": "busiest prefill-type",
                  "stop": rng.choice(["prefill-0", "pre-prefill-0", "decode-0"]),
                  "corrupt": "prefill-0,pre-prefill-0", "fill": "decode-0"}.get(k, "mooncake")
        out.append(Fault(k, round(at, 1), target))
    return out


class Faults:
    """Fires faults against one cluster: ``base`` the router, ``auth`` the cluster token
    header, ``launcher`` the ``warmpath serve`` process, ``load`` the running
    :class:`~benchmarks.chaos_load.Load`."""

    def __init__(self, base: str, auth: dict, launcher: int, load, heartbeat_s: float, stop_s: float,
                 l3_bytes: int, seed: int) -> None:
        self.base, self.auth, self.launcher, self.load = base, auth, launcher, load
        self.hb, self.stop_s, self.l3_bytes, self.seed = heartbeat_s, stop_s, l3_bytes, seed
        self.stopped: set[int] = set()   # PIDs SIGSTOPped now (SIGCONT on the way out)

    # -- looking at the cluster ------------------------------------------------
    def workers(self) -> dict[str, dict]:
        try:
            r = httpx.get(self.base + "/v1/cluster", headers=self.auth, timeout=5)
            return {w["worker_id"]: w for w in r.json()["workers"]}
        except (httpx.HTTPError, ValueError, KeyError):
            return {}

    def metric_sum(self, name: str, **labels) -> float:
        """``name`` summed over every registered worker's ``/metrics`` (samples with ``labels``)."""
        total = 0.0
        for w in self.workers().values():
            try:
                text = httpx.get(w["url"] + "/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
            total += sum(s.value for s in samples(text)
                         if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
        return total

    def store_pids(self) -> dict[str, int]:
        """The launcher's Mooncake master and segment holder."""
        out = {}
        for p in psutil.Process(self.launcher).children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if "mooncake_master" in cmd:
                out["master"] = p.pid
            elif "warmpath.kv.mooncake_service" in cmd:
                out["holder"] = p.pid
        return out

    def wait(self, pred, timeout: float, step: float = 0.1):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (got := pred()) is not None and got is not False:
                return got
            time.sleep(step)
        return None

    def since(self, t0: float, t: float | None) -> float | None:
        return None if t is None else round(t - t0, 2)

    # -- the faults -------------------------------------------------------------
    def fire(self, f: Fault) -> None:
        """Run ``f`` and measure it (bounded: every wait has a timeout)."""
        f.fired = time.monotonic()
        getattr(self, "_" + f.kind)(f)

    def busiest(self, window_s: float = 60.0) -> str:
        """The prefill-type worker that served the most of the last ``window_s`` seconds'
        requests (prefill-0 on a tie): killing it hurts the load the most."""
        since = time.monotonic() - window_s
        n = {"prefill-0": 0, "pre-prefill-0": 0}
        for s in list(self.load.target.log):
            if s.sent >= since and s.worker in n:
                n[s.worker] += 1
        return max(n, key=lambda w: (n[w], w == "prefill-0"))

    def _kill(self, f: Fault) -> None:
        if f.target.startswith("busiest"):
            f.target = self.busiest()
        old = self.workers()[f.target]["pid"]
        os.kill(old, signal.SIGKILL)
        t0 = f.fired
        gone = self.wait(lambda: time.monotonic() if f.target not in self.workers() else None, 30)
        ok = self.wait(lambda: self.load.first_ok(t0), 60)
        back = self.wait(lambda: time.monotonic() if self.workers().get(f.target, {}).get("pid") not in (None, old)
                         else None, 240, 0.5)
        served = self.wait(lambda: self.load.served_by(f.target, back), 60, 0.5) if back else None
        f.result = {"pid": old, "detected_s": self.since(t0, gone), "first_ok_after_s": self.since(t0, ok),
                    "rejoined_s": self.since(t0, back), "first_served_by_it_s": self.since(t0, served)}

    def _stop(self, f: Fault) -> None:
        pid = self.workers()[f.target]["pid"]
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)
        t0 = f.fired
        gone = self.wait(lambda: time.monotonic() if f.target not in self.workers() else None, self.stop_s)
        ok = self.wait(lambda: self.load.first_ok(t0), max(1.0, self.stop_s - (time.monotonic() - t0)))
        time.sleep(max(0.0, t0 + self.stop_s - time.monotonic()))
        os.kill(pid, signal.SIGCONT)
        self.stopped.discard(pid)
        t1 = time.monotonic()
        back = self.wait(lambda: time.monotonic() if f.target in self.workers() else None, 60)
        served = self.wait(lambda: self.load.served_by(f.target, t1), 60, 0.5)
        f.result = {"pid": pid, "stopped_s": self.stop_s, "detected_s": self.since(t0, gone),
                    "first_ok_after_s": self.since(t0, ok), "rejoined_after_cont_s": self.since(t1, back),
                    "first_served_by_it_after_cont_s": self.since(t1, served)}

    def _store(self, f: Fault) -> None:
        old = self.store_pids()
        written0 = self.metric_sum("warmpath_kv_tier_written_bytes_total", tier="L3")
        for pid in old.values():
            os.kill(pid, signal.SIGKILL)
        t0 = f.fired
        ok = self.wait(lambda: self.load.first_ok(t0), 60)
        back = self.wait(lambda: time.monotonic() if (p := self.store_pids()) and len(p) == len(old)
                         and not set(p.values()) & set(old.values()) else None, 60, 0.2)
        l3 = self.wait(lambda: time.monotonic() if self.metric_sum("warmpath_kv_tier_written_bytes_total", tier="L3")
                       > written0 and self.metric_sum("warmpath_kv_l3_up") >= 1 else None, 120, 0.5) if back else None
        f.result = {"pids": old, "first_ok_after_s": self.since(t0, ok), "restarted_s": self.since(t0, back),
                    "l3_written_again_s": self.since(t0, l3)}

    def _corrupt(self, f: Fault) -> None:
        """Flip bits in up to 4,096 stored blocks of each target, then SIGKILL the warm-tier
        worker: restarted with empty L1/L2, its warm prompts must load those blocks from L3,
        so a corrupted block is either refused (``warmpath_kv_verify_failures_total``) and
        recomputed or, if it were served, a wrong answer the load's check would count."""
        before = self.metric_sum("warmpath_kv_verify_failures_total")
        done = {}
        for w in f.target.split(","):
            url = self.workers().get(w, {}).get("url")
            r = httpx.post(url + "/internal/fault", headers=self.auth, timeout=120,
                           json={"kind": "l3-corrupt", "count": 4096, "seed": self.seed}) if url else None
            done[w] = r.json().get("corrupted", r.text[:200]) if r is not None and r.status_code == 200 else \
                (r.text[:200] if r is not None else "not registered")
        t0 = f.fired
        old = self.workers().get("prefill-0", {}).get("pid")
        if old:
            os.kill(old, signal.SIGKILL)
        back = self.wait(lambda: time.monotonic() if self.workers().get("prefill-0", {}).get("pid") not in (None, old)
                         else None, 240, 0.5)
        seen = self.wait(lambda: time.monotonic() if self.metric_sum("warmpath_kv_verify_failures_total") > before
                         else None, 90, 0.5)
        f.result = {"corrupted": done, "read_back_by": "prefill-0 (SIGKILLed, restarted)",
                    "rejoined_s": self.since(t0, back), "first_refusal_s": self.since(t0, seen),
                    "verify_failures": self.metric_sum("warmpath_kv_verify_failures_total") - before}

    def _fill(self, f: Fault) -> None:
        url = self.workers()[f.target]["url"]
        r = httpx.post(url + "/internal/fault", headers=self.auth, timeout=120,
                       json={"kind": "l3-fill", "bytes": int(self.l3_bytes * 1.5)})
        t0, t1 = f.fired, time.monotonic()
        ok = self.wait(lambda: self.load.first_ok(t1), 60)
        f.result = {"fill": r.json() if r.status_code == 200 else r.text[:200], "took_s": self.since(t0, t1),
                    "first_ok_after_s": self.since(t0, ok)}

    def resume_all(self) -> None:
        """SIGCONT whatever is still stopped (on any way out)."""
        for pid in list(self.stopped):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stopped.discard(pid)


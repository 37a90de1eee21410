"""Index fidelity under load (issue 30): while traffic runs, every ``--every`` seconds, each
vLLM worker's cached blocks by its own events (``GET /internal/kv/cached``) against what the
router's index holds for it (``POST /internal/kv/held``); the share and its summary (min,
p1, median, mean over samples with blocks cached) as ``warmpath/vllm/fidelity.py`` defines
them. Both routes take the cluster token (``--token`` or ``$WARMPATH_CLUSTER_TOKEN``).

Standalone, beside a bench on a running ``warmpath serve`` fleet of vLLM workers::

    WARMPATH_CLUSTER_TOKEN=... .venv/bin/python -m benchmarks.peers.vllm_fidelity \\
        --router http://127.0.0.1:PORT --duration 300 --out fidelity.json

samples the vLLM workers ``/v1/cluster`` lists (``--worker ID=URL``, repeatable: those).

``benchmarks/peers/vllm_routers.py --fidelity`` runs it during each warmpath run and writes
``fidelity.json`` beside the run's ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from warmpath.vllm.fidelity import Sample, sample, summarize


def sample_worker(worker: str, read: Callable[[], dict], ask: Callable[[str, list[str]], dict],
                  t: float) -> Sample:
    """One sample: the worker's cached blocks, the router asked about their keys, read again."""
    first = read()
    asked = list(first["keys"])
    reply = ask(worker, asked)
    return sample(t, first, asked, reply, read())


def vllm_workers(http: httpx.Client, router: str) -> dict[str, str]:
    """Worker id → URL of each registered worker whose ``/health`` says ``engine: vllm``."""
    out = {}
    for w in http.get(router + "/v1/cluster").raise_for_status().json()["workers"]:
        try:
            if w.get("url") and http.get(w["url"] + "/health").json().get("engine") == "vllm":
                out[w["worker_id"]] = w["url"]
        except (httpx.HTTPError, ValueError):
            continue
    return out


class FidelitySampler:
    """A thread sampling the router's vLLM workers every ``every_s`` until :meth:`stop`
    (listed once at the start, again when a sample of one fails: restarts), or the
    ``workers`` given (worker id → URL)."""

    def __init__(self, router: str, token: str | None, every_s: float = 2.0,
                 workers: dict[str, str] | None = None) -> None:
        self.router, self.every_s, self.given = router.rstrip("/"), every_s, dict(workers or {})
        self.http = httpx.Client(timeout=10, headers={"Authorization": f"Bearer {token}"} if token else None)
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fidelity")
        self._t0 = time.monotonic()

    def _get(self, url: str) -> dict:
        return self.http.get(url + "/internal/kv/cached").raise_for_status().json()

    def _ask(self, worker: str, keys: list[str]) -> dict:
        body = {"worker_id": worker, "keys": keys}
        return self.http.post(self.router + "/internal/kv/held", json=body).raise_for_status().json()

    def _loop(self) -> None:
        workers: dict[str, str] = dict(self.given)
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                workers = workers or self.given or vllm_workers(self.http, self.router)
                if not workers:
                    self.errors.append(f"{round(t - self._t0, 3)}: no vLLM worker listed with its URL "
                                       "(none registered, or /v1/cluster hid URLs: token / API key)")
                for w, url in workers.items():
                    self.samples.append(sample_worker(w, lambda u=url: self._get(u), self._ask,
                                                      round(t - self._t0, 3)))
            except (httpx.HTTPError, ValueError, KeyError) as e:
                self.errors.append(f"{round(t - self._t0, 3)}: {type(e).__name__}: {e}"[:300])
                workers = {}
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - t)))

    def start(self) -> "FidelitySampler":
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling; the summary (``vllm/fidelity.py``) with the sampling errors."""
        self._stop.set()
        self._thread.join(timeout=30)
        self.http.close()
        return {"router": self.router, "every_s": self.every_s, "errors": self.errors, **summarize(self.samples)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", required=True, help="the router's URL")
    ap.add_argument("--token", default=os.environ.get("WARMPATH_CLUSTER_TOKEN"),
                    help="the cluster token (default: $WARMPATH_CLUSTER_TOKEN)")
    ap.add_argument("--worker", action="append", default=[], metavar="ID=URL",
                    help="a vLLM worker to sample (repeatable; default: the router's, from /v1/cluster)")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds to sample")
    ap.add_argument("--out", type=Path, default=Path("fidelity.json"))
    a = ap.parse_args()
    if a.every <= 0 or a.duration <= 0:
        ap.error("--every and --duration must be > 0")
    if bad := [w for w in a.worker if "=" not in w]:
        ap.error(f"--worker takes ID=URL, got {bad}")
    s = FidelitySampler(a.router, a.token, a.every, dict(w.split("=", 1) for w in a.worker)).start()
    try:
        time.sleep(a.duration)
    except KeyboardInterrupt:
        pass
    out = s.stop()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"all": out["all"], "errors": len(out["errors"]), "lost_batches": out["lost_batches"]}))
    return 0 if out["all"]["samples"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The real side of ``benchmarks/tenants/fairness.py``: ``warmpath serve --topology replica``
(the router and one replica worker of at most ``MAX_SEQS`` sequences at once on this CPU; no
API keys, so ``X-Tenant-Id`` names the tenant) driven by ``warmpath bench``'s client (``bench/runner.py``), which sends each
session's tenant and priority."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time

import httpx

from benchmarks.reliability.cluster_procs import stop, tree, wait_ready
from warmpath.bench import runner
from warmpath.bench.workload import Session, Turn
from warmpath.procs import free_port


MAX_SEQS = 4    # the worker's batch: a CPU engine's few sequences at once, so the router's queue forms


class Runner:
    def __init__(self, a) -> None:
        self.a = a
        token = secrets.token_urlsafe(24)
        self.auth = {"Authorization": f"Bearer {token}"}
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--topology", "replica",
                "--host", "127.0.0.1", "--port", str(port), "--heartbeat-s", "1", "--max-num-seqs", str(MAX_SEQS)]
        a.out.mkdir(parents=True, exist_ok=True)
        self.log = open(a.out / "serve.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "WARMPATH_CLUSTER_TOKEN": token})
        wait_ready(self.proc, self.url, self.auth, 1, 600)
        self.seen = {p: None for p in tree(self.proc.pid)}

    def describe(self) -> str:
        return (f"real: warmpath serve --topology replica --max-num-seqs {MAX_SEQS} (router + one replica worker, "
                "2 threads) on this CPU")

    def capacity(self, seed: int) -> float:
        """Requests/s one replica completes under 32 requests at once."""
        n = 32
        flood = [Session(f"cap-{seed}-{i}", [Turn([1000 + (i * 7919 + j) % 39000 for j in range(self.a.prompt)],
                                                  self.a.answer, "cold")]) for i in range(n)]
        t0 = time.perf_counter()
        recs, _ = self.run(flood)
        return sum(1 for r in recs if r.ok) / (time.perf_counter() - t0)

    def run(self, sessions: list[Session]):
        """The records (TTFT from arrival); what the router's admission says of the tenants after."""
        target = runner.OpenAITarget(self.url, timeout_s=300.0)

        async def go():
            try:
                return await runner.run(target, sessions, seed=0)
            finally:
                await target.close()
        recs, _ = asyncio.run(go())
        self.seen.update({p: None for p in tree(self.proc.pid)})
        adm = httpx.get(self.url + "/v1/cluster", headers=self.auth, timeout=10).json()["admission"]
        return recs, {"tenants": adm.get("tenants"), "limited": adm.get("limited")}

    def close(self) -> None:
        stop(self.proc, self.seen)
        self.log.close()

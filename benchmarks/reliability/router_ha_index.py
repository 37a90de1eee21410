"""How fast a router that starts has a complete KV index (``benchmarks/reliability/router_ha.py``,
issue 56): ``--workers`` publishers holding ``--blocks`` blocks between them, each stored one
block per event batch (so the replay buffer, 10,000 batches, holds only the last part: without
the snapshot a new router could not rebuild the rest), and real router processes.

Router A starts; the workers register with it (their KV event endpoints); A's index fills from
the snapshots. Then router B starts with ``--peer A``: it reads A's registrations and the
workers' snapshots. Timed: from a router's process start, and from its first ``/health``, to
its index holding every block (``/v1/cluster``, ``routers[0].index_blocks``). B is then
SIGKILLed and started again ``--restarts`` times.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import httpx

from warmpath.kv.events import BlockStored, KVEventPublisher
from warmpath.procs import free_port

NS = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}


def publishers(workers: int, blocks: int, token: str) -> list[KVEventPublisher]:
    """``workers`` publishers, each with its share of ``blocks`` stored one per batch."""
    pubs = []
    for w in range(workers):
        pub = KVEventPublisher(f"w{w}", token=token)
        for i in range(blocks // workers):
            pub.publish([BlockStored([(w * blocks + i).to_bytes(16, "big")], None, [], 16, "L2")])
        pubs.append(pub)
    return pubs


def router(port: int, token: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "router", "--host",
                             "127.0.0.1", "--port", str(port), "--drop-after-s", "600", "--heartbeat-s", "60", *args],
                            env={**os.environ, "WARMPATH_CLUSTER_TOKEN": token}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def timed_start(port: int, token: str, want: int, *args: str, register=None) -> tuple[subprocess.Popen, dict]:
    """Start a router; seconds from its start to ``/health`` and to ``want`` indexed blocks."""
    auth = {"Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = router(port, token, *args)
    up = None
    with httpx.Client(timeout=2, headers=auth) as http:
        while time.monotonic() - t0 < 120:
            try:
                if up is None and http.get(url + "/health").status_code == 200:
                    up = time.monotonic()
                    if register is not None:
                        register(url)
                if up is not None and http.get(url + "/v1/cluster").json()["routers"][0]["index_blocks"]["local"] >= want:
                    done = time.monotonic()
                    return proc, {"start_to_health_s": round(up - t0, 3), "health_to_index_s": round(done - up, 3),
                                  "start_to_index_s": round(done - t0, 3)}
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"router on {port}: index not complete in 120 s")


def measure(blocks: int = 100_000, workers: int = 4, restarts: int = 3) -> dict:
    """The index rebuild times (see the module docstring)."""
    token = secrets.token_urlsafe(16)
    auth = {"Authorization": f"Bearer {token}"}
    t = time.monotonic()
    pubs = publishers(workers, blocks, token)
    made = time.monotonic() - t
    pa, pb = free_port(), free_port()
    a_url, b_url = f"http://127.0.0.1:{pa}", f"http://127.0.0.1:{pb}"

    def register(url: str) -> None:
        for p in pubs:
            body = {"worker_id": p.worker_id, "role": "replica", "url": f"http://127.0.0.1:{free_port()}",
                    "namespace": NS, "events_endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint}
            httpx.post(url + "/internal/register", json=body, headers=auth, timeout=5).raise_for_status()

    procs = []
    try:
        a, first = timed_start(pa, token, blocks, "--peer", b_url, register=register)
        procs.append(a)
        runs = []
        for _ in range(restarts + 1):
            b, r = timed_start(pb, token, blocks, "--peer", a_url)
            procs.append(b)
            runs.append(r)
            b.kill()
            b.wait()
        return {"blocks": blocks, "workers": workers, "batches_per_worker": blocks // workers,
                "replay_buffer_batches": 10_000, "publish_s": round(made, 2),
                "first_router_registered_by_workers": first, "peer_started": runs[0], "peer_restarted": runs[1:]}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in pubs:
            p.close()


if __name__ == "__main__":
    import json

    print(json.dumps(measure(), indent=1))

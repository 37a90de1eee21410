"""A worker with several routers (``--router URL,URL``, worker/registration.py): it
registers with and heartbeats to each, tells each of its drain (the in-flight counts added),
and a router that is down costs the others nothing."""

import asyncio

import httpx
import pytest

from tests.conftest import AUTH, CLUSTER_TOKEN, free_port, server, serve_processes
from warmpath.protocol.internal import Heartbeat
from warmpath.worker.registration import RegistrationConfig, keep_registered, report_drain

NS = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}


def test_router_urls_are_split_and_checked():
    cfg = RegistrationConfig("http://a:1/, http://b:2", "w", "replica", "http://w:3")
    assert cfg.router_urls == ("http://a:1", "http://b:2")
    with pytest.raises(ValueError, match="several, comma-separated"):
        RegistrationConfig("http://a:1,b:2", "w", "replica", "http://w:3")


def test_a_worker_reports_to_every_router_and_its_drain_adds_their_counts():
    dead = f"http://127.0.0.1:{free_port()}"       # a router that is down the whole time
    with serve_processes(server(command="router"), server(command="router")) as (r1, r2):
        cfg = RegistrationConfig(f"{r1},{r2},{dead}", "w0", "replica", f"http://127.0.0.1:{free_port()}",
                                 heartbeat_s=0.2, cluster_token=CLUSTER_TOKEN)
        body = {"worker_id": "w0", "role": "replica", "url": cfg.advertise_url, "namespace": NS, "max_num_seqs": 3}

        async def report() -> Heartbeat:
            return Heartbeat(worker_id="w0", running=1)

        async def run() -> int | None:
            task = asyncio.create_task(keep_registered(cfg, body, report))
            for _ in range(100):
                await asyncio.sleep(0.1)
                if all(any(w["worker_id"] == "w0" for w in httpx.get(r + "/v1/cluster", headers=AUTH).json()["workers"])
                       for r in (r1, r2)):
                    break
            n = await report_drain(cfg, left=False)
            task.cancel()
            return n

        assert asyncio.run(run()) == 0     # registered with both live routers; neither has a request there
        for r in (r1, r2):
            w = httpx.get(r + "/v1/cluster", headers=AUTH).json()["workers"]
            assert [(x["worker_id"], x["draining"]) for x in w] == [("w0", True)]

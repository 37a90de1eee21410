"""A running cpd-1d cluster (router + three workers + Mooncake as real processes): bad input
anywhere gets a 4xx and disturbs nothing; a worker whose engine dies is dropped within one
heartbeat and brought back by the launcher."""

import concurrent.futures as cf
import random
import time

import httpx

from tests.bad_requests import PUBLIC, ROUTER_INTERNAL, WORKER_INTERNAL, battery_beside_greedy, greedy_stream
from tests.conftest import AUTH, cluster_process, metric, wait_for

HEARTBEAT_S = 1.0   # cluster_process runs the workers with --heartbeat-s 1


def workers(base):
    return {w["worker_id"]: w for w in httpx.get(base + "/v1/cluster", timeout=5, headers=AUTH).json()["workers"]}


def test_bad_input_everywhere_then_an_engine_death_and_its_restart():
    with cluster_process("cpd-1d", env={"WARMPATH_FAULT_INJECTION": "1"}) as base:
        ws = workers(base)
        targets = [(base, PUBLIC + ROUTER_INTERNAL)] + [(w["url"], PUBLIC + WORKER_INTERNAL) for w in ws.values()]
        wrong, before, beside = battery_beside_greedy(base, targets)
        assert wrong == []
        assert before and beside == before
        assert greedy_stream(base) == before
        assert set(workers(base)) == set(ws)                       # nobody was dropped
        assert metric(base, "warmpath_router_client_errors_total", status="400") >= len(PUBLIC) - 5

        # Kill the warm-tier worker's engine thread: it reports itself, the router drops it.
        old_pid = ws["prefill-0"]["pid"]
        t0 = time.monotonic()
        assert httpx.post(ws["prefill-0"]["url"] + "/internal/fault", json={"kind": "engine-crash"},
                          headers=AUTH).status_code == 200
        wait_for(lambda: "prefill-0" not in workers(base), timeout=5)
        assert time.monotonic() - t0 <= HEARTBEAT_S
        assert metric(base, "warmpath_router_workers_dropped_total", reason="unhealthy") == 1
        assert greedy_stream(base) == before                      # served by the remaining tiers

        # The launcher starts it again (a new process) and the router routes to it again.
        back = wait_for(lambda: workers(base).get("prefill-0"), timeout=180)
        assert back["pid"] != old_pid
        assert greedy_stream(base) == before

        # A cold prompt in prefill on the pre-prefill worker when its engine dies: nothing was
        # produced for it, so the router retries it on the (restarted) warm-tier worker.
        cold = [random.Random(7).randrange(1000, 40000) for _ in range(3000)]
        with cf.ThreadPoolExecutor(1) as pool:
            f = pool.submit(httpx.post, base + "/v1/completions", timeout=300,
                            json={"prompt": cold, "max_tokens": 4, "temperature": 0, "ignore_eos": True})
            wait_for(lambda: workers(base)["pre-prefill-0"]["router_queued_prefill_tokens"] > 0, timeout=30)
            httpx.post(ws["pre-prefill-0"]["url"] + "/internal/fault", json={"kind": "engine-crash"}, headers=AUTH)
            r = f.result()
        assert r.status_code == 200 and r.headers["x-warmpath-worker"] == "prefill-0", r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert metric(base, "warmpath_router_retries_total") >= 1

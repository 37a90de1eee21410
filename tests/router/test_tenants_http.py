"""Tenants and priorities over real HTTP (router + one replica as processes): two API keys
name two tenants; one tenant's tokens-per-second and in-flight limits answer 429 with
Retry-After and leave the other tenant alone; bad priorities and tenant headers are 400s."""

import concurrent.futures as cf
import time

import httpx

from tests.conftest import free_port, metric, server, serve_processes

ALICE, BOB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}


def post(url, headers, max_tokens=4, stream=False, **extra):
    body = {"prompt": list(range(200, 220)), "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream, **extra}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120)


def test_two_tenants_limits_and_priorities():
    rport = free_port()
    rurl = f"http://127.0.0.1:{rport}"
    limits = ("--tenant-limit", "bob:tokens_s=30", "--tenant-limit", "alice:in_flight=1")
    with serve_processes(server("--api-key", "ka=alice", "--api-key", "kb=bob", *limits, command="router", port=rport),
                         server("--no-l3", "--router", rurl, "--worker-id", "w", "--heartbeat-s", "0.3",
                                command="worker")) as (router, _):
        deadline = time.monotonic() + 60
        while not httpx.get(router + "/v1/cluster", headers=ALICE, timeout=5).json()["workers"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # bob: 20 prompt + 4 answer tokens each, 30 tokens/s: the second at once is past it
        assert post(router, BOB).status_code == 200
        r = post(router, BOB)
        assert r.status_code == 429 and r.json()["error"]["code"] == "tenant_limit"
        assert r.headers["retry-after"] == "1" and "'bob'" in r.json()["error"]["message"]
        # alice: one in flight at most; bob is not held back by alice's
        with cf.ThreadPoolExecutor(1) as pool:
            long = pool.submit(post, router, ALICE, 200)
            time.sleep(1.0)
            second = post(router, ALICE)
            assert second.status_code == 429 and second.headers["retry-after"] == "1"
            time.sleep(1.0)
            assert post(router, BOB).status_code == 200
            assert long.result().status_code == 200
        r = post(router, ALICE, priority=-5)
        assert r.status_code == 200 and (r.headers["x-warmpath-tenant"], r.headers["x-warmpath-priority"]) == ("alice", "-5")
        assert metric(router, "warmpath_router_tenant_requests_total", tenant="bob", outcome="limited") == 1
        assert metric(router, "warmpath_router_tenant_requests_total", tenant="alice", outcome="admitted") == 2
        adm = httpx.get(router + "/v1/cluster", headers=ALICE, timeout=5).json()["admission"]
        assert adm["limited"] == 2 and adm["tenants"]["alice"]["in_flight"] == 0
        assert adm["tenants"]["alice"]["counter"] > 0 and adm["tenants"]["bob"]["counter"] > 0
        # bad input: a 400 naming it
        assert post(router, ALICE, priority=1 << 20).status_code == 400
        bad = httpx.post(router + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1},
                         headers={**ALICE, "X-Priority": "urgent"}, timeout=30)
        assert bad.status_code == 400 and "X-Priority" in bad.json()["error"]["message"]
    with serve_processes(server(command="router")) as (open_router,):   # no API keys: X-Tenant-Id names the tenant
        r = httpx.post(open_router + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1},
                       headers={"X-Tenant-Id": "no spaces allowed"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-tenant-id"

"""Authentication with real processes: a router and a worker that share a cluster token (and
each have their own API keys), plus a bare router for the redacted cluster view.

Without the token nobody registers a URL, posts a heartbeat or calls a worker's
``/internal/*`` (401, nothing changes); with it the cluster serves as before and the router's
KV event subscription (ZeroMQ PLAIN) works. API keys guard ``/v1/*``.
"""

import time

import httpx
import pytest

from tests.conftest import AUTH, CLUSTER_TOKEN, free_port, metric, serve_process, serve_processes, server

ROUTER_KEYS = ("router-key-1", "router-key-2")
WORKER_KEY = "worker-key"
KEY = {"Authorization": f"Bearer {ROUTER_KEYS[1]}"}
NS = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}
PREFILL = {"prompt_token_ids": list(range(100, 140)), "request": {"max_tokens": 1, "temperature": 0}}
GENERATE = {"kind": "text", "prompt_token_ids": list(range(100, 140)), "request": {"max_tokens": 2, "temperature": 0}}


def wait_for(pred, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if got := pred():
            return got
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def workers(router, headers=KEY) -> dict:
    return {w["worker_id"]: w for w in httpx.get(router + "/v1/cluster", headers=headers, timeout=5).json()["workers"]}


def is_401(r: httpx.Response, code: str) -> bool:
    err = r.json().get("error", {})
    return r.status_code == 401 and err.get("type") == "authentication_error" and err.get("code") == code


@pytest.fixture(scope="module")
def stack():
    """A router (token from conftest's env, two API keys) and one replica worker (same token,
    its own API key, a heartbeat so slow that a forged one would stand for the whole test)."""
    rport = free_port()
    router_url = f"http://127.0.0.1:{rport}"
    with serve_processes(
            server("--drop-after-s", "300", "--api-key", ROUTER_KEYS[0], "--api-key", ROUTER_KEYS[1],
                   command="router", port=rport),
            server("--no-l3", "--router", router_url, "--worker-id", "w1", "--heartbeat-s", "120",
                   "--override-generation-config", '{"temperature": 0.5}',
                   command="worker", env={"WARMPATH_API_KEY": WORKER_KEY})) as (router, _):
        w = wait_for(lambda: workers(router).get("w1"))
        yield router, w["url"]


def test_router_internal_routes_refuse_calls_without_the_cluster_token(stack):
    router, worker = stack
    before = workers(router)
    forged = {"worker_id": "w1", "role": "replica", "url": "http://attacker.example:9", "namespace": NS}
    for headers in (None, {"Authorization": "Bearer not-the-token"}, {"Authorization": f"Basic {CLUSTER_TOKEN}"},
                    {"Authorization": CLUSTER_TOKEN}):
        for body in (forged, {**forged, "worker_id": "evil"}):
            assert is_401(httpx.post(router + "/internal/register", json=body, headers=headers),
                          "invalid_cluster_token")
        assert is_401(httpx.post(router + "/internal/heartbeat", headers=headers,
                                 json={"worker_id": "w1", "l3_bytes_s": 1.0, "running": 7}), "invalid_cluster_token")
        assert is_401(httpx.post(router + "/internal/heartbeat", headers=headers,
                                 json={"worker_id": "w1", "healthy": False}), "invalid_cluster_token")
    # checked before the body is read: a malformed or invalid body is a 401 too, not a 400
    assert is_401(httpx.post(router + "/internal/register", content=b"{nope"), "invalid_cluster_token")
    assert is_401(httpx.post(router + "/internal/heartbeat", json={"worker_id": 5}), "invalid_cluster_token")
    # an API key is not the cluster token
    assert httpx.post(router + "/internal/register", json=forged, headers=KEY).status_code == 401
    after = workers(router)
    assert after == before                        # same workers, same URL, same load (l3_bytes_s, running)
    assert after["w1"]["url"] == worker and after["w1"]["l3_bytes_s"] != 1.0
    assert metric(router, "warmpath_router_workers_dropped_total", reason="unhealthy") in (None, 0)
    # the token opens the door (an unknown worker's heartbeat is then a plain 404)
    r = httpx.post(router + "/internal/heartbeat", json={"worker_id": "nobody"}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["param"] == "worker_id"


def test_worker_internal_routes_need_the_cluster_token(stack):
    _, worker = stack
    for path, body in (("/internal/prefill", PREFILL), ("/internal/generate", GENERATE)):
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {WORKER_KEY}"}):
            assert is_401(httpx.post(worker + path, json=body, headers=headers, timeout=30), "invalid_cluster_token")
        assert is_401(httpx.post(worker + path, content=b"{nope"), "invalid_cluster_token")
    assert metric(worker, "warmpath_prefix_cache_query_tokens") in (None, 0)   # nothing ran
    pre = httpx.post(worker + "/internal/prefill", json=PREFILL, headers=AUTH, timeout=60)
    assert pre.status_code == 200 and pre.json()["prompt_tokens"] == 40
    gen = httpx.post(worker + "/internal/generate", json=GENERATE, headers=AUTH, timeout=60)
    assert gen.status_code == 200 and gen.json()["usage"]["completion_tokens"] == 2


def test_with_credentials_the_cluster_serves_and_kv_events_reach_the_router(stack):
    router, _ = stack
    body = {"prompt": list(range(200, 264)), "max_tokens": 3, "temperature": 0}
    r = httpx.post(router + "/v1/completions", json=body, headers=KEY, timeout=120)
    assert r.status_code == 200 and r.headers["x-warmpath-worker"] == "w1", r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    # the router follows the worker's KV events over the token-guarded ZeroMQ sockets
    wait_for(lambda: workers(router)["w1"]["indexed_blocks"] >= 4, timeout=30)


def test_api_keys_guard_the_routers_v1_routes(stack):
    router, _ = stack
    cases = [("GET", "/v1/models", None), ("GET", "/v1/cluster", None),
             ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
             ("POST", "/v1/chat/completions", {"messages": []})]     # invalid, but 401 comes first
    for method, path, body in cases:
        for headers in (None, {"Authorization": "Bearer wrong"}, AUTH, {"Authorization": f"Bearer {WORKER_KEY}"},
                        {"Authorization": f"Bearer {ROUTER_KEYS[0]}x"}):
            r = httpx.request(method, router + path, json=body, headers=headers, timeout=30)
            assert is_401(r, "invalid_api_key"), (path, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
    for key in ROUTER_KEYS:
        r = httpx.get(router + "/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and r.json()["data"][0]["id"]
    # the defaults the worker registered: its --override-generation-config over the model's
    d = r.json()["data"][0]["generation_defaults"]
    assert (d["temperature"], d["sources"]["temperature"]) == (0.5, "--override-generation-config")
    assert (d["top_p"], d["sources"]["top_p"]) == (0.9, "model table")
    assert httpx.get(router + "/health").status_code == 200
    assert httpx.get(router + "/metrics").status_code == 200
    # with API keys, a valid key sees the whole view
    w = workers(router, KEY)["w1"]
    assert w["pid"] > 0 and w["url"].startswith("http://127.0.0.1:")


def test_api_key_guards_a_workers_v1_routes(stack):
    _, worker = stack
    for headers in (None, AUTH, {"Authorization": f"Bearer {ROUTER_KEYS[0]}"}):
        r = httpx.get(worker + "/v1/models", headers=headers)
        assert is_401(r, "invalid_api_key") and r.headers["www-authenticate"] == "Bearer"
        r = httpx.post(worker + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, headers=headers)
        assert is_401(r, "invalid_api_key")
    ok = {"Authorization": f"Bearer {WORKER_KEY}"}
    assert httpx.get(worker + "/v1/models", headers=ok).status_code == 200
    r = httpx.post(worker + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, headers=ok, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    assert httpx.get(worker + "/health").status_code == 200 and httpx.get(worker + "/metrics").status_code == 200


def test_cluster_view_without_credentials_shows_no_pids_or_urls():
    """A router with a cluster token and no API keys: /v1/cluster is public, but PIDs and
    internal URLs are for holders of the token."""
    with serve_process(command="router") as router:
        reg = {"worker_id": "x", "role": "replica", "url": "http://127.0.0.1:1", "namespace": NS, "pid": 4242}
        assert httpx.post(router + "/internal/register", json=reg).status_code == 401
        assert httpx.post(router + "/internal/register", json=reg, headers=AUTH).status_code == 200
        for headers in (None, {"Authorization": "Bearer wrong"}):
            r = httpx.get(router + "/v1/cluster", headers=headers)
            assert r.status_code == 200
            (w,) = r.json()["workers"]
            assert w["worker_id"] == "x" and "pid" not in w and "url" not in w
            assert "4242" not in r.text and "127.0.0.1:1" not in r.text
        (w,) = httpx.get(router + "/v1/cluster", headers=AUTH).json()["workers"]
        assert w["pid"] == 4242 and w["url"] == "http://127.0.0.1:1"


def test_bench_target_sends_its_api_key(stack):
    """``warmpath bench --api-key`` against a router with keys: the key opens /v1/*."""
    import asyncio

    from warmpath.bench.runner import OpenAITarget

    router, _ = stack

    async def model(key):
        t = OpenAITarget(router, api_key=key)
        try:
            return await t.resolve_model()
        finally:
            await t.http.aclose()

    assert asyncio.run(model(ROUTER_KEYS[0])) == "SmolLM2-135M-Instruct"
    with pytest.raises(httpx.HTTPStatusError) as e:
        asyncio.run(model(None))
    assert e.value.response.status_code == 401

"""The router process in front of two real replica workers (real HTTP, real KV events)."""

import concurrent.futures as cf
import time

import httpx
import openai
from httpx_sse import connect_sse

from tests.conftest import free_port, serve_process, serve_processes, server

M = "SmolLM2-135M-Instruct"


def wait_for(pred, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def cluster(router):
    return httpx.get(router + "/v1/cluster", timeout=5).json()


def test_prefix_aware_routing_across_replicas(smollm):
    rport = free_port()
    router_url = f"http://127.0.0.1:{rport}"
    with serve_processes(
            server(command="router", port=rport),
            server("--no-l3", "--router", router_url, "--worker-id", "w1", "--heartbeat-s", "0.3", command="worker"),
            server("--no-l3", "--router", router_url, "--worker-id", "w2", "--heartbeat-s", "0.3",
                   command="worker")) as (router, _, _):
        wait_for(lambda: len(cluster(router)["workers"]) == 2)
        adm = cluster(router)["admission"]   # sized to what the two workers registered
        assert adm["source"] == "fleet" and set(adm["slots"]) == {"w1", "w2"}
        assert adm["max_in_flight"] == sum(adm["slots"].values()) == 2 * 64   # no request size yet
        prompt = smollm.tokenizer.encode("Routers should send warm prompts home. " * 60)[:300]
        body = {"model": M, "prompt": prompt, "max_tokens": 4, "temperature": 0}
        r1 = httpx.post(router + "/v1/completions", json=body, timeout=120)
        assert r1.status_code == 200 and r1.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        home = r1.headers["x-warmpath-worker"]
        def home_view():
            return next(w for w in cluster(router)["workers"] if w["worker_id"] == home)

        # the worker's KV events reach the router's index (18 sealed prompt blocks at least) and
        # its heartbeat says it is idle again (heartbeat load is what the estimate sees)
        wait_for(lambda: home_view()["indexed_blocks"] >= 18 and home_view()["queued_prefill_tokens"] == 0
                 and home_view()["running"] == 0)
        for _ in range(2):
            r = httpx.post(router + "/v1/completions", json=body, timeout=120)
            assert r.headers["x-warmpath-worker"] == home
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 288
            assert r.json()["choices"][0]["text"] == r1.json()["choices"][0]["text"]
        c = openai.OpenAI(base_url=router + "/v1", api_key="none", max_retries=0)
        chunks = c.chat.completions.create(model=M, temperature=0, stream=True, messages=[
            {"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)
        bad = httpx.post(router + "/v1/chat/completions", json={"messages": []}, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_admission_rejects_beyond_limit_with_retry_after():
    rport = free_port()
    router_url = f"http://127.0.0.1:{rport}"
    with serve_processes(
            server("--max-in-flight", "1", "--cold-queue", "1", "--warm-queue", "0", command="router", port=rport),
            server("--no-l3", "--router", router_url, "--worker-id", "solo")) as (router, _):
        wait_for(lambda: len(cluster(router)["workers"]) == 1)
        def send(k):  # distinct prompts: all cold
            body = {"model": M, "prompt": [1000 * (k + 1) + i for i in range(40)], "max_tokens": 40,
                    "temperature": 0, "ignore_eos": True}
            return httpx.post(router + "/v1/completions", json=body, timeout=120)

        with cf.ThreadPoolExecutor(4) as ex:
            rs = list(ex.map(send, range(4)))
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) == 2 and codes.count(429) == 2   # 1 running + 1 queued, 2 rejected
        rejected = next(r for r in rs if r.status_code == 429)
        assert rejected.headers["retry-after"] == "1"
        assert rejected.json()["error"]["type"] == "rate_limit_error"
        adm = cluster(router)["admission"]
        assert {k: adm[k] for k in ("in_flight", "waiting", "rejected", "max_in_flight", "source", "peak_waiting")} == {
            "in_flight": 0, "waiting": 0, "rejected": 2, "max_in_flight": 1, "source": "fixed", "peak_waiting": 1}
        assert adm["queue_limits"] == {"cold": 1, "warm": 0}


def test_dead_worker_before_first_token_is_retried_elsewhere(smollm):
    import os
    import signal

    rport = free_port()
    router_url = f"http://127.0.0.1:{rport}"
    procs = []
    with serve_processes(
            server(command="router", port=rport),
            server("--no-l3", "--router", router_url, "--worker-id", "w1", "--heartbeat-s", "0.3", procs=procs),
            server("--no-l3", "--router", router_url, "--worker-id", "w2", "--heartbeat-s", "0.3",
                   procs=procs)) as (router, _, _):
        wait_for(lambda: len(cluster(router)["workers"]) == 2)
        adm = cluster(router)["admission"]   # sized to what the two workers registered
        assert adm["source"] == "fleet" and set(adm["slots"]) == {"w1", "w2"}
        assert adm["max_in_flight"] == sum(adm["slots"].values()) == 2 * 64   # no request size yet
        prompt = smollm.tokenizer.encode("Failover keeps answers flowing. " * 60)[:200]
        body = {"model": M, "prompt": prompt, "max_tokens": 4, "temperature": 0}
        r1 = httpx.post(router + "/v1/completions", json=body, timeout=120)
        home = r1.headers["x-warmpath-worker"]
        def home_view():
            return next(w for w in cluster(router)["workers"] if w["worker_id"] == home)

        # the router knows home holds the prompt and is idle again: it will pick home next
        wait_for(lambda: home_view()["indexed_blocks"] >= 12 and home_view()["queued_prefill_tokens"] == 0
                 and home_view()["running"] == 0)
        victim = procs[0] if home == "w1" else procs[1]
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        for stream in (False, True):
            b = dict(body, stream=stream)
            with httpx.stream("POST", router + "/v1/completions", json=b, timeout=120) as r:
                text = r.read().decode()
                assert r.status_code == 200
                assert r.headers["x-warmpath-worker"] != home
            if not stream:
                assert httpx.Response(200, content=text).json()["choices"][0]["text"] == \
                    r1.json()["choices"][0]["text"]
            else:
                assert text.rstrip().endswith("data: [DONE]")
        c = cluster(router)
        assert c["retries"] == 1 and [w["worker_id"] for w in c["workers"]] == [
            "w2" if home == "w1" else "w1"]
        assert c["admission"]["in_flight"] == 0


def test_worker_dying_mid_stream_gives_a_clean_error_and_router_stays_up():
    import json
    import os
    import signal

    rport = free_port()
    router_url = f"http://127.0.0.1:{rport}"
    procs = []
    with serve_processes(server(command="router", port=rport),
                         server("--no-l3", "--router", router_url, "--worker-id", "w1", procs=procs)) as (router, _):
        wait_for(lambda: len(cluster(router)["workers"]) == 1)
        body = {"model": M, "prompt": [500 + i for i in range(30)], "max_tokens": 2000, "temperature": 0,
                "ignore_eos": True, "stream": True}
        events = []
        with httpx.Client(timeout=120) as http, connect_sse(http, "POST", router + "/v1/completions",
                                                            json=body) as es:
            assert es.response.status_code == 200
            for ev in es.iter_sse():
                events.append(ev.data)
                if len(events) == 5:
                    os.killpg(procs[0].pid, signal.SIGKILL)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])
        assert err["error"]["type"] == "server_error" and "mid-stream" in err["error"]["message"]
        assert httpx.get(router + "/health", timeout=5).status_code == 200
        c = cluster(router)
        assert c["mid_stream_failures"] == 1 and c["admission"]["in_flight"] == 0


def test_admission_limit_follows_the_registered_workers():
    from tests.conftest import CLUSTER_TOKEN
    auth = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
    ns = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}
    with serve_process(command="router") as router:
        def register(wid, role, seqs, **kw):
            body = {"worker_id": wid, "role": role, "url": f"http://127.0.0.1:{free_port()}", "namespace": ns,
                    "max_num_seqs": seqs, "kv_capacity_tokens": 4096, **kw}
            assert httpx.post(router + "/internal/register", json=body, headers=auth, timeout=5).status_code == 200

        assert cluster(router)["admission"]["max_in_flight"] == 1      # no worker yet
        register("p", "prefill", 3)
        defaults = {"temperature": 0.2, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.1,
                    "max_tokens": 1024}
        register("d", "decode", 5, overlaps_loads=True, prefill_chunk_tokens=2048, generation_defaults=defaults)
        seen = {w["worker_id"]: (w["overlaps_loads"], w["chunk_tokens"], w["default_max_tokens"])
                for w in cluster(router)["workers"]}
        # the predictor's view of how each loads KV, chunks a prompt and what answer it gives by default
        assert seen == {"p": (False, None, None), "d": (True, 2048, 1024)}
        adm = cluster(router)["admission"]
        assert (adm["max_in_flight"], adm["slots"], adm["queue_limits"]) == (8, {"p": 3, "d": 5}, {"cold": 32, "warm": 64})
        r = httpx.post(router + "/internal/heartbeat", json={"worker_id": "d", "healthy": False}, headers=auth, timeout=5)
        assert r.status_code == 200 and cluster(router)["admission"]["max_in_flight"] == 3
        bad = {"worker_id": "x", "role": "decode", "url": "http://127.0.0.1:1", "namespace": ns, "max_num_seqs": 0}
        r = httpx.post(router + "/internal/register", json=bad, headers=auth, timeout=5)
        assert r.status_code == 400 and "max_num_seqs" in r.json()["error"]["param"]


def test_a_drained_worker_gets_nothing_new_then_is_removed():
    """``/internal/drain``: a draining worker stays registered but leaves the routable set
    (here the only prefill worker: the router then computes prompts on the decode worker), ``resume`` undoes it,
    ``remove`` forgets it."""
    from tests.conftest import CLUSTER_TOKEN
    auth = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
    ns = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}
    with serve_process("--route-policy", "pd", command="router") as router:
        for wid, role in (("p", "prefill"), ("d", "decode")):
            body = {"worker_id": wid, "role": role, "url": f"http://127.0.0.1:{free_port()}", "namespace": ns,
                    "max_num_seqs": 4, "kv_capacity_tokens": 4096}
            assert httpx.post(router + "/internal/register", json=body, headers=auth, timeout=5).status_code == 200

        def drain(action):
            return httpx.post(router + "/internal/drain", json={"worker_id": "p", "action": action},
                              headers=auth, timeout=5)

        assert path(router) == ["p", "d"]
        assert drain("drain").json() == {"worker_id": "p", "registered": True, "draining": True, "in_flight": 0}
        assert path(router) == ["d"]      # out of every path: with no prefill worker, d computes prompts
        p = {w["worker_id"]: w for w in cluster(router)["workers"]}["p"]
        assert (p["draining"], p["in_flight"]) == (True, 0)
        assert cluster(router)["admission"]["slots"] == {"d": 4}
        assert drain("resume").json()["draining"] is False
        assert httpx.get(router + "/ready", timeout=5).status_code == 200
        assert drain("remove").json() == {"worker_id": "p", "registered": False, "draining": False, "in_flight": 0}
        assert drain("drain").status_code == 404
        assert httpx.post(router + "/internal/drain", json={"worker_id": "d"}, timeout=5).status_code == 401


def path(router):
    """``/ready``'s path for a probe request (the workers that would compute and decode it)."""
    r = httpx.get(router + "/ready", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()["path"]

"""CPD isolation, admission, and failures, with real processes (router, workers, Mooncake).

Each class's tests share one cluster (started once, stopped after the class's last test,
in the class's order), which also answers ``test_same_text_in_every_topology``'s requests
for its topology (tests/launch/test_topologies_http.py)."""

import concurrent.futures as cf
import json
import os
import random
import signal
import time

import httpx
import pytest
from httpx_sse import connect_sse

from tests.conftest import AUTH, cluster_process, free_port, metric, serve_process, serve_processes, server
from tests.launch.conftest import check_same_text

M = "SmolLM2-135M-Instruct"


def cluster(base):
    return httpx.get(base + "/v1/cluster", timeout=5, headers=AUTH).json()   # with worker PIDs and URLs


def worker(base, wid):
    return next((w for w in cluster(base)["workers"] if w["worker_id"] == wid), None)


def wait_for(pred, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if got := pred():
            return got
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(n)]


@pytest.fixture(scope="class")
def cpd_1d():
    with cluster_process("cpd-1d") as base:
        yield base


@pytest.fixture(scope="class")
def pd_2p1d():
    with cluster_process("pd-2p1d", "--max-in-flight", "2", "--cold-queue", "1", "--warm-queue", "1") as base:
        yield base


class TestCpd1d:
    """One cpd-1d cluster: the isolation test first (it counts on the router's counters
    starting at zero), then the same-text requests."""

    def test_cpd_cold_prompt_in_flight_does_not_delay_a_warm_request(self, cpd_1d):
        base = cpd_1d
        context, cold = tokens(1500, 1), tokens(3000, 2)
        prime = httpx.post(base + "/v1/completions", timeout=120,
                           json={"prompt": context + [5, 6], "max_tokens": 1, "temperature": 0})
        assert prime.headers["x-warmpath-route"] == "cold"
        assert prime.headers["x-warmpath-worker"] == "pre-prefill-0"
        # the pre-prefill worker's L3 events reach the router's index: its 93 full blocks
        wait_for(lambda: (metric(base, "warmpath_router_index_blocks", set="l3") or 0) >= 93)
        done = {}

        def send(name, prompt):
            r = httpx.post(base + "/v1/completions", timeout=300,
                           json={"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True})
            done[name] = time.monotonic()
            return r

        with cf.ThreadPoolExecutor(2) as pool:
            fc = pool.submit(send, "cold", cold)
            wait_for(lambda: worker(base, "pre-prefill-0")["router_queued_prefill_tokens"] > 0)
            fw = pool.submit(send, "warm", context + tokens(40, 3))
            rw, rc = fw.result(), fc.result()
        assert rc.status_code == rw.status_code == 200
        assert rc.headers["x-warmpath-route"] == "cold" and rc.headers["x-warmpath-worker"] == "pre-prefill-0"
        assert rw.headers["x-warmpath-route"] == "warm" and rw.headers["x-warmpath-worker"] == "prefill-0"
        usage = rw.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 1488  # 93 full shared blocks, from L3
        assert usage["warmpath"]["prefill"]["cached_tokens"] == 1488    # as prefill-0 measured it
        # the decode worker's own loads: (1540 + 1 - 1) // 16 = 96 blocks that prefill-0 wrote
        # through to L3 (93 present, 3 written), the last 4 prompt tokens recomputed
        own = usage["warmpath"]["decode"]
        assert 0 < own.pop("l3_load_s") < 60      # the seconds its L3 load took (the router learns its rate)
        assert own == {"loaded_tokens": {"L1": 0, "L2": 0, "L3": 1536}, "recomputed_tokens": 4}
        assert done["warm"] < done["cold"]
        # the warm request never queued behind the cold one: its queue time (admission wait +
        # the prefill engine's queue) fell in the lowest buckets, and only one warm was counted
        assert metric(base, "warmpath_router_queue_seconds_count", cls="warm") == 1
        assert metric(base, "warmpath_router_queue_seconds_bucket", cls="warm", le="0.1") == 1
        assert metric(base, "warmpath_router_requests_total", route="warm", cls="warm") == 1
        assert metric(base, "warmpath_router_kv_handoff_bytes_total") > 0

    def test_same_text_as_one_engine(self, cpd_1d, reference):
        check_same_text(cpd_1d, reference)


class TestPd2p1d:
    """One pd-2p1d cluster that admits 2 requests at once and queues 1 of each class: the
    same-text requests first (one at a time: the limits never bite), then the admission
    test, which kills its workers."""

    def test_same_text_as_one_engine(self, pd_2p1d, reference):
        check_same_text(pd_2p1d, reference)

    def test_admission_and_failures_in_a_disaggregated_cluster(self, pd_2p1d):
        base = pd_2p1d
        body = {"model": M, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
                "ignore_eos": True}
        with cf.ThreadPoolExecutor(8) as pool:
            rs = list(pool.map(lambda _: httpx.post(base + "/v1/completions", json=body, timeout=120), range(8)))
        codes = sorted(r.status_code for r in rs)
        assert 429 in codes and all(c in (200, 429) for c in codes), codes
        texts = {r.json()["choices"][0]["text"] for r in rs if r.status_code == 200}
        assert len(texts) == 1 and all(r.headers.get("retry-after") == "1" for r in rs if r.status_code == 429)
        (text,) = texts

        # a prefill worker killed before the first token: the request is retried on the other
        p0 = worker(base, "prefill-0")["pid"]
        os.kill(p0, signal.SIGKILL)
        r = httpx.post(base + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text
        assert r.headers["x-warmpath-worker"] == "prefill-1"
        info = cluster(base)
        assert info["retries"] == 1 and worker(base, "prefill-0") is None
        # ... and the launcher starts it again
        wait_for(lambda: (w := worker(base, "prefill-0")) is not None and w["pid"] != p0, timeout=120)

        # a worker whose heartbeats stop disappears from routing (the other serves), and comes back
        p1 = worker(base, "prefill-1")["pid"]
        os.kill(p1, signal.SIGSTOP)
        try:
            wait_for(lambda: worker(base, "prefill-1") is None, timeout=30)
            r = httpx.post(base + "/v1/completions", json=body, timeout=30)
            assert r.status_code == 200 and r.headers["x-warmpath-worker"] == "prefill-0"
            assert r.json()["choices"][0]["text"] == text
            # ... and with no prefill worker left, the decode worker computes the prompt itself
            p0 = worker(base, "prefill-0")["pid"]
            os.kill(p0, signal.SIGSTOP)
            try:
                wait_for(lambda: worker(base, "prefill-0") is None, timeout=30)
                r = httpx.post(base + "/v1/completions", json=body, timeout=30)
                assert r.status_code == 200, r.text
                assert (r.headers["x-warmpath-worker"], r.headers["x-warmpath-route"]) == ("decode-0", "local")
                assert r.json()["choices"][0]["text"] == text
            finally:
                os.kill(p0, signal.SIGCONT)
        finally:
            os.kill(p1, signal.SIGCONT)
        wait_for(lambda: worker(base, "prefill-1") is not None and worker(base, "prefill-0") is not None, timeout=30)

        # the decode worker killed after the first token: a clean error event, router stays up
        long = {**body, "max_tokens": 400, "stream": True}
        d0 = worker(base, "decode-0")["pid"]
        with httpx.Client(timeout=120) as http, connect_sse(http, "POST", base + "/v1/completions",
                                                            json=long) as es:
            events = es.iter_sse()
            got = [next(events).json() for _ in range(3)]
            assert all("text" in g["choices"][0] for g in got)
            os.kill(d0, signal.SIGKILL)
            rest = [ev.data for ev in events]
        assert "mid-stream" in json.loads(rest[-2])["error"]["message"] and rest[-1] == "[DONE]"
        assert httpx.get(base + "/health", timeout=5).status_code == 200
        p = worker(base, "prefill-1")["url"]
        assert metric(p, "warmpath_num_requests_running", model=M) == 0   # nothing left behind
        assert metric(p, "warmpath_kv_cache_usage_ratio", model=M) == 0
        assert cluster(base)["admission"]["in_flight"] == 0
        r = httpx.post(base + "/v1/completions", json={**body, "stream": False}, timeout=30)
        if r.status_code != 200:    # before the launcher restarted the decode worker: a clean 503
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        wait_for(lambda: (w := worker(base, "decode-0")) is not None and w["pid"] != d0, timeout=120)
        r = httpx.post(base + "/v1/completions", json={**body, "stream": False}, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text


def test_restarted_worker_loses_its_index_entries_and_recomputes_the_same_answer(smollm):
    """A worker SIGKILLed and started again at the same address: its re-registration tells
    the router the old process is gone (a new pid), so the router forgets the blocks the
    dead process held instead of routing on stale hints; the new one recomputes the prompt
    and the answer does not change."""
    rport, wport = free_port(), free_port()
    router = f"http://127.0.0.1:{rport}"
    prompt = smollm.tokenizer.encode("Stale routing hints must never change answers. " * 40)[:300]
    body = {"model": M, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    wargs = ("--no-l3", "--router", router, "--worker-id", "w1", "--heartbeat-s", "0.3")
    procs = []
    with serve_processes(server(command="router", port=rport),
                         server(*wargs, command="worker", port=wport, procs=procs)):
        wait_for(lambda: worker(router, "w1"))
        first = httpx.post(router + "/v1/completions", json=body, timeout=120).json()
        wait_for(lambda: worker(router, "w1")["indexed_blocks"] >= 18)
        os.killpg(procs[0].pid, signal.SIGKILL)     # the first worker process
        procs[0].wait()
        with serve_process(*wargs, command="worker", port=wport):
            wait_for(lambda: metric(router, "warmpath_router_workers_dropped_total", reason="replaced") == 1)
            assert worker(router, "w1")["indexed_blocks"] == 0       # nothing of the dead process
            again = httpx.post(router + "/v1/completions", json=body, timeout=120)
            assert again.headers["x-warmpath-worker"] == "w1"
            assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert again.json()["choices"][0]["text"] == first["choices"][0]["text"]
            wait_for(lambda: worker(router, "w1")["indexed_blocks"] >= 18)   # the new process's blocks

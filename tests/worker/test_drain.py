"""SIGTERM drains a worker behind a router (real processes): the router routes nothing new
to it, the stream it was answering runs to its end, then it leaves (dropped as ``drained``)
and exits 0."""

import json
import os
import signal
import threading
import time

import httpx
from httpx_sse import connect_sse

from tests.conftest import AUTH, free_port, metric, serve_process

M = "SmolLM2-135M-Instruct"


def workers(base):
    return {w["worker_id"]: w for w in httpx.get(base + "/v1/cluster", timeout=5, headers=AUTH).json()["workers"]}


def wait_for(pred, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if got := pred():
            return got
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_sigterm_drains_the_stream_under_way_routes_new_requests_elsewhere_then_exits_0():
    rport = free_port()
    router = f"http://127.0.0.1:{rport}"
    args = ("--no-l3", "--router", router, "--heartbeat-s", "0.5", "--kv-cache-gib", "0.25", "--l2-gib", "0")
    procs: list = []
    with serve_process("--heartbeat-s", "0.5", "--drop-after-s", "30", command="router", port=rport), \
            serve_process(*args, "--worker-id", "a", command="worker", procs=procs), \
            serve_process(*args, "--worker-id", "b", command="worker", procs=procs):
        ws = wait_for(lambda: (w := workers(router)).keys() == {"a", "b"} and w)
        by_pid = {p.pid: p for p in procs}
        body = {"model": M, "prompt": "Once upon a time", "max_tokens": 96, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        events, first = [], threading.Event()
        seen: dict = {}

        def stream() -> None:
            try:
                with httpx.Client(timeout=120) as c, connect_sse(c, "POST", router + "/v1/completions",
                                                                 json=body, headers=AUTH) as es:
                    seen["worker"] = es.response.headers.get("x-warmpath-worker")
                    for ev in es.iter_sse():
                        events.append(ev.data)
                        first.set()
            finally:
                first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(60) and seen.get("worker"), events
        victim, other = seen["worker"], ({"a", "b"} - {seen["worker"]}).pop()
        proc = by_pid[ws[victim]["pid"]]
        os.kill(proc.pid, signal.SIGTERM)
        wait_for(lambda: workers(router)[victim]["draining"], timeout=10)
        assert events[-1] != "[DONE]"                             # the stream is still under way
        ready = httpx.get(ws[victim]["url"] + "/ready", timeout=5)
        assert (ready.status_code, ready.json()["detail"]) == (503, "draining")

        # New requests meanwhile go to the other worker, every one of them.
        for _ in range(3):
            r = httpx.post(router + "/v1/completions", timeout=60,
                           json={"model": M, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
            assert (r.status_code, r.headers["x-warmpath-worker"]) == (200, other), r.text

        # The stream ends complete; then the worker leaves and exits 0.
        t.join(120)
        assert events[-1] == "[DONE]" and not any('"error"' in e for e in events), events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 96
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert proc.wait(timeout=30) == 0
        assert metric(router, "warmpath_router_workers_dropped_total", reason="drained") == 1
        assert metric(router, "warmpath_router_retries_total") == 0
        assert set(workers(router)) == {other}

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

from tests.conftest import AUTH, free_port, metric, serve_processes, server

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
    with serve_processes(server("--heartbeat-s", "0.5", "--drop-after-s", "30", command="router", port=rport),
                         server(*args, "--worker-id", "a", command="worker", procs=procs),
                         server(*args, "--worker-id", "b", command="worker", procs=procs)):
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


def test_a_decode_worker_drains_only_after_the_request_whose_prefill_runs_elsewhere():
    """pd, one prefill and one decode worker: SIGTERM reaches the decode worker while a cold
    prompt is still in prefill on the other one. The router counts that request as the
    decode worker's (its decode will go there), so the drain waits for it: it is decoded
    there, nothing is retried, and only then does the worker leave and exit 0."""
    import random

    rport = free_port()
    router = f"http://127.0.0.1:{rport}"
    args = ("--no-l3", "--router", router, "--heartbeat-s", "0.5", "--kv-cache-gib", "0.25", "--l2-gib", "0")
    procs: list = []
    with serve_processes(server("--route-policy", "pd", "--heartbeat-s", "0.5", command="router", port=rport),
                         server(*args, "--role", "prefill", "--worker-id", "p", command="worker", procs=procs),
                         server(*args, "--role", "decode", "--worker-id", "d", command="worker", procs=procs)):
        wait_for(lambda: workers(router).keys() == {"p", "d"})
        decode = procs[1]
        cold = [random.Random(3).randrange(1000, 40000) for _ in range(3000)]
        out: dict = {}

        def send() -> None:
            out["r"] = httpx.post(router + "/v1/completions", timeout=300, json={
                "model": M, "prompt": cold, "max_tokens": 8, "temperature": 0, "ignore_eos": True})

        t = threading.Thread(target=send)
        t.start()
        wait_for(lambda: workers(router)["p"]["router_queued_prefill_tokens"] > 0, timeout=30)
        os.kill(decode.pid, signal.SIGTERM)
        wait_for(lambda: workers(router)["d"]["draining"], timeout=10)
        assert "r" not in out                                      # still in prefill on p
        t.join(300)
        r = out["r"]
        assert r.status_code == 200, r.text
        assert r.headers["x-warmpath-decode"] == "d" and r.json()["usage"]["completion_tokens"] == 8
        assert decode.wait(timeout=30) == 0
        assert metric(router, "warmpath_router_retries_total") == 0
        assert metric(router, "warmpath_router_workers_dropped_total", reason="drained") == 1
        assert set(workers(router)) == {"p"}


def _drain_with(routed: list, open_here: list, **cfg):
    """Run a ``Drain`` whose router answers ``routed`` (one value per ask, the last repeated)
    and whose own open-request count is ``open_here`` (same); returns it, what it told, the time."""
    import asyncio

    from warmpath.worker.drain import Drain

    told, asks = [], iter(range(10**6))
    d = Drain(**cfg)

    async def tell(left: bool):
        told.append(left)
        return routed[min(next(asks), len(routed) - 1)] if not left else None

    counts = iter(range(10**6))
    t0 = time.monotonic()
    ok = asyncio.run(d.run(lambda: open_here[min(next(counts), len(open_here) - 1)], tell))
    return d, ok, told, time.monotonic() - t0


def test_the_drain_waits_for_what_the_router_still_routes_here_then_for_quiet():
    # nothing open here, but the router has 2, then 1 (a prefill elsewhere whose decode comes here), then 0
    d, ok, told, took = _drain_with([2, 1, 0], [0], settle_s=0.2, poll_s=0.05, timeout_s=10)
    assert ok is True and d.drained is True and d.done and d.active
    assert told[0] is False and told[-1] is True and told.count(False) >= 3    # asked until it said 0
    assert 2 * 0.05 + 0.2 <= took < 5


def test_the_drain_gives_up_at_its_timeout_and_still_says_it_left():
    d, ok, told, took = _drain_with([None], [1], settle_s=0.1, poll_s=0.05, timeout_s=0.3)
    assert ok is False and d.drained is False and d.done
    assert told[-1] is True and 0.3 <= took < 3


def test_bad_drain_settings_are_refused():
    import pytest

    from warmpath.worker.drain import Drain

    with pytest.raises(ValueError, match="poll > 0"):
        Drain(poll_s=0)
    with pytest.raises(ValueError, match="timeout, settle >= 0"):
        Drain(timeout_s=-1)

"""One bad request never stops a worker (real `warmpath serve` process, real SmolLM2, real HTTP)."""

import concurrent.futures as cf
import time

import httpx
import pytest

from tests.bad_requests import MSG, PUBLIC, WORKER_INTERNAL, battery_beside_greedy, greedy_stream
from tests.conftest import AUTH, free_port, serve_process

FAULTS = {"WARMPATH_FAULT_INJECTION": "1"}


@pytest.fixture(scope="module")
def worker():
    with serve_process("--topology", "single", "--no-l3", env=FAULTS) as base:
        yield base


def test_every_bad_request_gets_its_4xx_and_a_greedy_request_beside_is_unchanged(worker):
    wrong, before, beside = battery_beside_greedy(worker, [(worker, PUBLIC + WORKER_INTERNAL)])
    assert wrong == []
    assert before and beside == before
    assert greedy_stream(worker) == before                      # and it answers normally afterwards
    assert httpx.get(worker + "/health").json() == {"status": "ok"}


def test_a_request_that_fails_inside_a_step_fails_alone(worker):
    before = greedy_stream(worker)
    assert httpx.post(worker + "/internal/fault", json={"kind": "sampler-seed", "seed": 777},
                      headers=AUTH).status_code == 200
    poison = {"messages": MSG, "max_tokens": 30, "temperature": 0.7, "seed": 777}
    with cf.ThreadPoolExecutor(3) as pool:
        beside = pool.submit(greedy_stream, worker)
        bad = pool.submit(httpx.post, worker + "/v1/chat/completions", json=poison, timeout=120)
        streamed = pool.submit(lambda: httpx.post(worker + "/v1/chat/completions", timeout=120,
                                                  json={**poison, "stream": True}).text)
        r, events = bad.result(), streamed.result()
        assert beside.result() == before
    assert r.status_code == 500 and r.json()["error"]["code"] == "request_failed"
    assert "injected sampler fault (seed 777)" in r.json()["error"]["message"]
    assert '"code": "request_failed"' in events and events.rstrip().endswith("data: [DONE]")
    ok = httpx.post(worker + "/v1/chat/completions", json={**poison, "seed": 778}, timeout=120)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert httpx.get(worker + "/health").json() == {"status": "ok"}


def test_an_engine_crash_fails_in_flight_requests_with_503_and_the_process_exits():
    port = free_port()
    procs = []
    with serve_process("--topology", "single", "--no-l3", env=FAULTS, port=port, procs=procs) as base:
        with cf.ThreadPoolExecutor(1) as pool:
            long = pool.submit(httpx.post, base + "/v1/completions", timeout=120,
                               json={"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                                     "temperature": 0})
            time.sleep(1.0)
            httpx.post(base + "/internal/fault", json={"kind": "engine-crash"}, headers=AUTH)
            r = long.result()
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_failed"
        assert procs[0].wait(timeout=30) == 1                      # exits for its supervisor to restart
        assert "the engine stopped" in procs[0].stdout.read()

"""Fuzzing a running cluster (the router and one replica worker as real processes, real
SmolLM2, real HTTP), the short seeded run (the full one: benchmarks/reliability/fuzz.py): requests
generated from each server's own OpenAPI schema, requests that break HTTP's framing, and
clients that leave mid-answer (those alone: their aborts are counted exactly), while a greedy
stream runs beside the rest. Not one answer is a
5xx or off its schema, the stream never changes, and afterwards the same processes serve,
idle, their KV pool all free, having aborted exactly the requests whose clients left."""

import json
import os

import httpx

from tests.bad_requests import greedy_stream
from tests.conftest import AUTH, cluster_process
from tests.fuzzing import Canary, Fuzzer, log_alarms
from tests.raw_requests import (check_raw, engine_state, generating, leave_before_answer, leave_mid_stream,
                                wait_idle)

CASES = 100   # generated requests per server
MAX_NEW = 2   # tokens an accepted generated request may ask for (tests/fuzzing.py: cheap)
CONTEXT = 128
FLAGS = ("--no-l3", "--l2-gib", "0", "--kv-cache-gib", "0.05", "--max-model-len", str(CONTEXT),
         "--default-max-tokens", str(MAX_NEW))
PUBLIC = "^/(v1|health|ready|metrics|dashboard)"


def only_worker(base: str) -> dict:
    (w,) = httpx.get(base + "/v1/cluster", timeout=5, headers=AUTH).json()["workers"]
    return w


def test_fuzzed_requests_get_no_5xx_and_disturb_nothing(tmp_path):
    topo = tmp_path / "one-replica.json"
    topo.write_text(json.dumps({"policy": "replica", "workers": {"replica": 1}}))
    logs = []
    with cluster_process(str(topo), *FLAGS, logs=logs) as base:
        w = only_worker(base)
        worker = w["url"]
        with Canary(base, max_tokens=16) as canary:
            runs = [Fuzzer(base, "router", paths=PUBLIC, max_model_len=CONTEXT, max_new=MAX_NEW).run(CASES, 1),
                    Fuzzer(worker, "worker", AUTH, max_model_len=CONTEXT, max_new=MAX_NEW).run(CASES, 2),
                    Fuzzer(base, "router /internal without the token", paths="^/internal/", expect=401).run(10)]
            wrong = check_raw(base, AUTH) + check_raw(worker, AUTH)
        aborted = engine_state(worker)["aborted"]
        for target in (base, worker):                     # the clients of 4 long requests leave
            assert leave_mid_stream(target, AUTH) == 200
            wait_idle(worker)
            leave_before_answer(target, AUTH, generating([worker]))
            wait_idle(worker)
        failed = [(r.server, r.failures) for r in runs if r.failures]
        assert failed == [], json.dumps(failed, indent=1, default=str)   # in full: the answer body too
        assert [r.sent >= n for r, n in zip(runs, (CASES, CASES, 10))] == [True] * 3
        assert wrong == []
        assert canary.runs >= 1 and canary.wrong == []
        # each left request was aborted (not run to its end): its blocks are free again
        assert wait_idle(worker) == {"running": 0, "waiting": 0, "kv_usage": 0, "aborted": aborted + 4}
        assert greedy_stream(base, canary.max_tokens) == canary.reference      # it serves normally
        assert only_worker(base)["pid"] == w["pid"]                            # no restart
        assert log_alarms(os.pread(logs[0].fileno(), 1 << 24, 0).decode(errors="replace")) == []

"""``warmpath deploy --ray`` on a Ray cluster of three "hosts" (network namespaces on one
bridge): a Ray head (the store and the router stay there) and two Ray worker nodes.

cpd-1d deployed by the CLI (two store segments, on two nodes); the greedy answer of a single engine; the second turn cached;
a worker's process SIGKILLed under load → Ray restarts its actor and the worker serves
again, no request failed; the warm tier scaled 1 → 2 → 1 under load with a drain, no request
failed; ``--down``. Minutes of CPU: run by ``make test-ray`` (``WARMPATH_RAY_TESTS=1``), not
the main suite. Needs root, iproute2 and Ray (``requirements/ray.txt``); skipped saying why.
"""

import os
import random
import secrets
import signal
import sys
import threading
import time

import httpx
import pytest

from tests.conftest import served_params
from tests.deploy.raycluster import RayHosts, skip_reason
from warmpath.engine.llm_engine import EngineConfig, LLMEngine

pytestmark = [
    pytest.mark.skipif(os.environ.get("WARMPATH_RAY_TESTS") != "1",
                       reason="Ray cluster tests take minutes: make test-ray (WARMPATH_RAY_TESTS=1)"),
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
    pytest.mark.timeout(1200),
]

NODES = {"a": "10.78.0.1", "b": "10.78.0.2", "c": "10.78.0.3"}
ROUTER = "http://10.78.0.1:8000"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
DOC = [random.Random(3).randrange(1000, 40000) for _ in range(600)]
DEPLOY = ("--topology", "cpd-1d", "--worker-args", "--threads 1 --kv-cache-gib 0.25 --l2-gib 0.25",
          "--store-args", "--segment-gib 0.5", "--store-segments", "2")


@pytest.fixture(scope="module")
def reference(served_model):
    e = LLMEngine(EngineConfig(), loaded=served_model)
    tok = e.tokenizer
    ids = tok.encode(tok.apply_chat_template(QUESTION), add_special=False)
    return tok.decode(e.generate([ids], served_params(served_model, 16, temperature=0))[0], skip_special=True)


class Load:
    """``n`` clients in the head's namespace sending warm completions (the document plus a
    new tail) back to back; every outcome kept."""

    def __init__(self, rc: RayHosts, n: int = 2):
        self.stop, self.outcomes = threading.Event(), []
        self.futures = [rc.pool("a").submit(self._client, i) for i in range(n)]

    def _client(self, i: int) -> None:
        k = 0
        with httpx.Client(timeout=120) as http:
            while not self.stop.is_set():
                k += 1
                body = {"prompt": DOC + [100 + i, k % 900 + 1000], "max_tokens": 8, "temperature": 0,
                        "ignore_eos": True}
                try:
                    self.outcomes.append(http.post(ROUTER + "/v1/completions", json=body).status_code)
                except httpx.HTTPError as e:
                    self.outcomes.append(repr(e))

    def end(self) -> list:
        self.stop.set()
        for f in self.futures:
            f.result(timeout=180)
        return self.outcomes


def test_cpd_on_ray_across_three_nodes(reference):
    token = secrets.token_urlsafe(24)
    auth = {"Authorization": f"Bearer {token}"}
    with RayHosts(NODES, {"a": 0, "b": 2, "c": 2}) as rc:
        rc.env["WARMPATH_CLUSTER_TOKEN"] = token

        def workers() -> dict:
            try:
                r = rc.on("a", httpx.get, ROUTER + "/v1/cluster", headers=auth, timeout=5)
                return {w["worker_id"]: w for w in r.json()["workers"]}
            except httpx.HTTPError:
                return {}

        out = rc.deploy(*DEPLOY)
        assert f"serving on {ROUTER}/v1" in out.stdout
        procs = rc.status()["processes"]
        assert sorted(procs) == ["decode-0", "pre-prefill-0", "prefill-0", "router", "store", "store-1"]
        assert procs["router"]["host"] == procs["store"]["host"] == NODES["a"]   # pinned to the head
        assert procs["store-1"]["host"] in (NODES["b"], NODES["c"])              # a segment per node
        hosts = {procs[w]["host"] for w in ("pre-prefill-0", "prefill-0", "decode-0")}
        assert hosts == {NODES["b"], NODES["c"]}                                # spread over both nodes
        assert workers()["decode-0"]["url"].startswith(f"http://{procs['decode-0']['host']}:")

        # greedy answer identical to a single engine
        r = rc.on("a", httpx.post, ROUTER + "/v1/chat/completions", timeout=120,
                  json={"messages": QUESTION, "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == reference

        # a cold document, then its second turn served from cache
        body = {"prompt": DOC, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        r1 = rc.on("a", httpx.post, ROUTER + "/v1/completions", json=body, timeout=120)
        assert r1.status_code == 200 and r1.headers["x-warmpath-worker"] == "pre-prefill-0"
        time.sleep(1.5)
        r2 = rc.on("a", httpx.post, ROUTER + "/v1/completions", timeout=120, json={**body, "prompt": DOC + [11, 12, 13]})
        assert r2.status_code == 200 and r2.headers["x-warmpath-route"] == "warm"
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 576

        # SIGKILL prefill-0's process under load: Ray restarts its actor, the worker serves again
        load = Load(rc)
        time.sleep(2)
        old = procs["prefill-0"]["pid"]
        killed = time.monotonic()
        os.kill(old, signal.SIGKILL)
        back = rc.wait(lambda: (w := workers().get("prefill-0")) and w["pid"] not in (None, old) and w, 120,
                       "prefill-0 registered again")
        answer = rc.on("a", httpx.post, back["url"] + "/v1/completions", headers=auth, timeout=60,
                       json={"prompt": [1, 2, 3], "max_tokens": 2})
        restart_s = time.monotonic() - killed
        assert answer.status_code == 200
        time.sleep(2)
        outcomes = load.end()
        print(f"prefill-0: SIGKILL -> serving again in {restart_s:.1f} s; {len(outcomes)} requests under load")
        assert outcomes and all(o == 200 for o in outcomes), outcomes
        again = rc.status()["processes"]["prefill-0"]
        assert again["reconstructed"] is True and again["pid"] != old and again["registered"] is True

        # the warm tier 1 -> 2 -> 1 under load: the one scaled away is drained first
        load = Load(rc)
        up = rc.json("--scale", "prefill=2")
        assert up == {"started": ["prefill-1"], "stopped": {}}
        assert "prefill-1" in workers()
        time.sleep(3)
        down = rc.json("--scale", "prefill=1")
        assert down["started"] == [] and list(down["stopped"]) == ["prefill-1"]
        time.sleep(1)
        outcomes = load.end()
        print(f"scale 1->2->1: {len(outcomes)} requests under load, drain took {down['stopped']['prefill-1']} s")
        assert outcomes and all(o == 200 for o in outcomes), outcomes
        assert "prefill-1" not in workers() and "prefill-1" not in rc.status()["processes"]

        stopped = rc.deploy("--down").stdout
        assert "stopped decode-0, pre-prefill-0, prefill-0, router, store-1, store" in stopped
        r = rc.run("a", [sys.executable, "-m", "warmpath.cli", "deploy", "--ray", rc.address, "--status"])
        assert r.returncode != 0

"""Two routers, active-active, behind HAProxy (``serve --routers 2``), as real processes:
SIGKILL one under a steady load. No request sent after the kill fails; a stream that was in
flight on the dead router ends with an error (no hang); the launcher restarts the router,
whose index then equals its peer's; a follow-up turn sent to the restarted router lands on
the worker that holds its prefix."""

import concurrent.futures as cf
import os
import signal
import threading
import time

import httpx

from tests import conftest
from tests.conftest import AUTH, cluster_process

SYSTEM = ("You are a careful assistant for a software team. Answer briefly and precisely; name the files "
          "you would change and why. ") * 6


def cluster(url: str) -> dict:
    return httpx.get(url + "/v1/cluster", timeout=5, headers=AUTH).json()


def chat(url: str, messages: list, max_tokens: int = 4, timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=timeout,
                      json={"messages": messages, "max_tokens": max_tokens, "temperature": 0})


def wait_for(pred, timeout: float):
    return conftest.wait_for(pred, timeout, (httpx.HTTPError, ValueError, KeyError))


def stream_outcome(url: str) -> str:
    """A long stream on ``url``: ``done``, or ``error`` when it broke off (it must not hang)."""
    body = {"messages": [{"role": "user", "content": "Count from one to a hundred."}], "max_tokens": 400,
            "temperature": 0, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            text = "".join(r.iter_text())
        return "done" if "[DONE]" in text else "error"
    except httpx.HTTPError:
        return "error"


def test_a_router_killed_under_load_loses_no_new_request_and_comes_back_whole():
    with cluster_process("replica-2", "--routers", "2") as base:
        urls = [r["url"] for r in cluster(base)["routers"]]
        me = {u: cluster(u)["routers"][0] for u in urls}          # each router's own entry (its PID)
        victim, peer = sorted(urls, key=lambda u: me[u]["url"])
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where do retries live?"}]
        r1 = chat(base, first, max_tokens=8)
        assert r1.status_code == 200, r1.text
        turn2 = [*first, {"role": "assistant", "content": r1.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And the timeouts?"}]

        stop, sent = threading.Event(), []        # (monotonic send time, status or exception name)

        def client(i: int) -> None:
            for n in range(60):                   # bounded: at most 60 requests per client
                if stop.is_set():
                    return
                t = time.monotonic()
                try:
                    status = chat(base, [{"role": "user", "content": f"client {i} request {n}: say hi"}]).status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                sent.append((t, status))

        with cf.ThreadPoolExecutor(4) as pool:
            stream = pool.submit(stream_outcome, victim)          # in flight on the router we kill
            loads = [pool.submit(client, i) for i in range(2)]
            wait_for(lambda: len(sent) >= 4, 60)
            killed = time.monotonic()
            os.kill(me[victim]["pid"], signal.SIGKILL)
            assert stream.result(timeout=30) == "error"            # ended with an error, not a hang
            wait_for(lambda: sum(t > killed for t, _ in sent) >= 8, 90)
            stop.set()
            for f in loads:
                f.result(timeout=120)
        after = [s for t, s in sent if t > killed]
        assert after and all(s == 200 for s in after), after

        # the launcher restarts it (same port); ready only once its index is whole, equal to its peer's
        wait_for(lambda: httpx.get(victim + "/ready", timeout=2).status_code == 200, 90)
        new = cluster(victim)["routers"][0]
        assert new["pid"] != me[victim]["pid"]
        def whole() -> tuple:
            a, b = cluster(victim)["routers"][0], cluster(peer)["routers"][0]
            return [(x["index_blocks"]["local"], x["index_blocks"]["l3"], x["event_seqs"]) for x in (a, b)]
        try:
            wait_for(lambda: (w := whole())[0] == w[1], 5)
        except AssertionError:
            raise AssertionError(f"restarted vs peer (local, l3, event seqs): {whole()}") from None
        assert whole()[0][0] > 0 and cluster(victim)["routers_agree"]

        # turn 2, on the restarted router: found in L1 where turn 1 left it (its index came from snapshots)
        r2 = chat(victim, turn2, max_tokens=4)
        assert r2.status_code == 200, r2.text
        assert r2.json()["usage"]["warmpath"]["worker"]["loaded_tokens"].get("L1", 0) >= 64, r2.json()["usage"]

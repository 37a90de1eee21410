"""Elastic roles on real processes (router, two prefill workers and a decode worker, Mooncake,
the real SmolLM2): under ``--elastic roles`` with a TPOT bound no decode can meet, the decode
worker is pressed as soon as it decodes and most requests go local, so the router lends a
prefill worker to the decode side as a *replica* — while requests stream, none of them lost,
every answer the same greedy text — and records the change where role changes are recorded
(``/v1/cluster``, the dashboard's role log with its reason, the Prometheus counter); the
worker learns its new role from its heartbeat's answer."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.conftest import AUTH, cluster_process, metric
from tests.launch.conftest import QUESTION, M

N = 8


def ask(base: str, i: int) -> tuple[int, str, str | None]:
    """One streamed greedy chat request: status, text, the worker that served it."""
    body = {"model": M, "messages": QUESTION, "temperature": 0, "max_tokens": 16, "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        return r.status_code, text, r.headers.get("x-warmpath-worker")


def test_a_prefill_worker_becomes_a_replica_under_load_with_no_request_lost(tmp_path):
    topo = tmp_path / "goodput-2p1d.json"
    topo.write_text(json.dumps({"policy": "goodput", "workers": {"prefill": 2, "decode": 1}}))
    with cluster_process(str(topo), "--slo", "warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.0001",
                         "--elastic", "roles", "--elastic-hold-s", "0", "--elastic-cooldown-s", "3600") as base:
        # one at a time, each local on the idle decode worker, until the router (once a second)
        # sees it decode: the share routed local is then 1 (concurrent requests first would let
        # the policy send some remote, and the share could fall under 0.5 before the change)
        changed = lambda: httpx.get(base + "/v1/cluster", timeout=5).json()["elastic"]["changes"]   # noqa: E731
        got, deadline = [], time.monotonic() + 20
        while len(got) < 4 or (time.monotonic() < deadline and not changed()):
            got.append(ask(base, len(got)))
        with ThreadPoolExecutor(4) as pool:                             # then while the change drains
            got += list(pool.map(lambda i: ask(base, i), range(len(got), len(got) + N)))
        got += [ask(base, len(got)) for _ in range(4)]                  # and after it
        assert all(s == 200 for s, _, _ in got), got
        assert len({t for _, t, _ in got}) == 1 and got[0][1], got     # one greedy answer, every time
        info = httpx.get(base + "/v1/cluster", headers=AUTH, timeout=5).json()
        el = info["elastic"]
        assert el["enabled"] and el["roles"] == ["pre-prefill", "prefill", "decode", "replica"]
        [ch] = el["changes"]              # one (the cooldown is an hour): the least pressed prefill worker
        lent, kept = (ch["worker"], "prefill-1" if ch["worker"] == "prefill-0" else "prefill-0")
        assert (ch["old"], ch["new"], lent in ("prefill-0", "prefill-1")) == ("prefill", "replica", True)
        assert ch["reason"].startswith("decode pressure ")   # the share routed local (>= 0.5) made it a replica
        assert float(ch["reason"].rsplit(" ", 1)[1]) >= 0.5
        roles = {w["worker_id"]: w["role"] for w in info["workers"]}
        assert roles == {lent: "replica", kept: "prefill", "decode-0": "decode"}
        assert metric(base, "warmpath_router_role_changes_total", role="replica") == 1
        log = httpx.get(base + "/v1/dashboard/state", timeout=5).json()["role_changes"]
        assert [(x["worker"], x["from"], x["to"]) for x in log] == [(lent, "prefill", "replica")]
        assert log[0]["reason"] == el["changes"][0]["reason"]
        # the worker was told: its heartbeats are answered with the role it has now
        beat = httpx.post(base + "/internal/heartbeat", json={"worker_id": lent}, headers=AUTH, timeout=5)
        assert beat.json() == {"ok": True, "role": "replica"}
        assert httpx.get(base + "/ready", timeout=5).status_code == 200

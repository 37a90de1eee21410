"""``warmpath deploy --ray`` measured (issue 32): a worker's death to its replacement serving,
requests failed during a scale-down with drain, and Ray's overhead on TTFT at low load.

On a Ray cluster of three "hosts" (network namespaces: the head with the store and the
router, two Ray worker nodes; tests/deploy/raycluster.py), deploys cpd-1d and:

* ``--kills`` times: SIGKILL prefill-0's process under two clients' load; seconds until the
  restarted worker is registered and answers a request itself; failed requests meanwhile;
* ``--scales`` times: the warm tier 1 → 2 → 1 under four clients' load; failed requests
  and the drain's seconds;
* ``--ttft-requests`` streamed requests one at a time (cold, distinct prompts): TTFT p50
  through the three-node Ray deployment (its KV handoffs cross the bridge), through the
  same deployment on a one-node Ray cluster (every process in one namespace: Ray's own
  overhead, the same network path as ``serve``), and through ``warmpath serve --topology
  cpd-1d`` (same worker flags, on 127.0.0.1) on this machine.

Needs root, iproute2 and Ray. Writes ``OUT/ray_deploy.json``.

    python -m benchmarks.reliability.ray_deploy [--kills 3] [--scales 3] [--ttft-requests 40]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import time
from pathlib import Path

import httpx

from tests.conftest import AUTH, cluster_process
from tests.deploy.raycluster import RayHosts, skip_reason
from tests.deploy.test_ray_cluster import DEPLOY, NODES, ROUTER, Load

FLAGS = ["--threads", "1"]   # cluster_process adds the KV sizes of DEPLOY's workers and a 0.5 GiB store


def ttft(post_stream, url: str, n: int, headers: dict) -> list[float]:
    """TTFT of ``n`` streamed cold completions (distinct 200-token prompts), one at a time."""
    out = []
    for i in range(n):
        prompt = [random.Random(1000 + i).randrange(1000, 40000) for _ in range(200)]
        out.append(post_stream(url, {"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}, headers))
    return out


def first_token_s(url: str, body: dict, headers: dict) -> float:
    start = time.monotonic()
    with httpx.Client(timeout=120) as http, http.stream("POST", url + "/v1/completions", json=body,
                                                       headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.monotonic() - start
    raise RuntimeError("no token streamed")


def kills(rc: RayHosts, auth: dict, n: int) -> list[dict]:
    def workers():
        try:
            return {w["worker_id"]: w for w in rc.on("a", httpx.get, ROUTER + "/v1/cluster", headers=auth,
                                                       timeout=5).json()["workers"]}
        except httpx.HTTPError:
            return {}
    out = []
    for _ in range(n):
        load = Load(rc)
        time.sleep(3)
        old = workers()["prefill-0"]["pid"]
        t0, wall0 = time.monotonic(), time.time()
        os.kill(old, signal.SIGKILL)
        back = rc.wait(lambda old=old: (w := workers().get("prefill-0")) and w["pid"] not in (None, old) and w,
                       120, "back")
        registered = time.monotonic() - t0
        ok = rc.on("a", httpx.post, back["url"] + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2},
                   headers=auth, timeout=60).status_code == 200   # a worker behind a router wants the token
        serving = time.monotonic() - t0
        time.sleep(2)
        outcomes = load.end()
        # Ray's part: from the kill to the new actor's process started (ProcessHost.started_at)
        restarted = rc.status()["processes"]["prefill-0"].get("started_at", wall0) - wall0
        out.append({"registered_s": round(registered, 2), "serving_s": round(serving, 2), "answered": ok,
                    "ray_restart_s": round(restarted, 2), "process_start_s": round(registered - restarted, 2),
                    "requests": len(outcomes), "failed": sum(o != 200 for o in outcomes)})
        print("kill:", out[-1], flush=True)
    return out


def scales(rc: RayHosts, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        load = Load(rc, 4)
        up = rc.json("--scale", "prefill=2")
        time.sleep(10)
        down = rc.json("--scale", "prefill=1")
        time.sleep(2)
        outcomes = load.end()
        out.append({"started": up["started"], "drained_s": down["stopped"], "requests": len(outcomes),
                    "failed": sum(o != 200 for o in outcomes)})
        print("scale:", out[-1], flush=True)
    return out


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--scales", type=int, default=3)
    ap.add_argument("--ttft-requests", type=int, default=40)
    ap.add_argument("--only-ttft", action="store_true", help="skip the kills and scale-downs")
    ap.add_argument("--out", default="benchmarks/results/ray_deploy")
    a = ap.parse_args()
    if (why := skip_reason()) is not None:
        raise SystemExit(why)
    token = "ray-deploy-bench-" + str(random.randrange(1 << 60))
    auth = {"Authorization": f"Bearer {token}"}
    result: dict = {"goals": {"restart_serving_s": 10, "scale_down_failed": 0, "ttft_p50_overhead": 0.05}}
    with RayHosts(NODES, {"a": 0, "b": 2, "c": 2}, nice=0) as rc:   # the priority `warmpath serve` runs at
        rc.env["WARMPATH_CLUSTER_TOKEN"] = token
        rc.deploy(*DEPLOY)
        ray_ttft = rc.on("a", ttft, first_token_s, ROUTER, a.ttft_requests, auth)
        if not a.only_ttft:
            result["kills"] = kills(rc, auth, a.kills)
            result["scales"] = scales(rc, a.scales)
        rc.deploy("--down")
    with RayHosts({"a": NODES["a"]}, {"a": 4}, prefix="wp1", nice=0) as one:
        one.env["WARMPATH_CLUSTER_TOKEN"] = token
        one.deploy(*DEPLOY[:4], "--store-args", "--segment-gib 0.5")
        one_ttft = one.on("a", ttft, first_token_s, ROUTER, a.ttft_requests, auth)
        one.deploy("--down")
    with cluster_process("cpd-1d", *FLAGS) as url:
        serve_ttft = ttft(first_token_s, url, a.ttft_requests, AUTH)
    ms = lambda xs: [round(x * 1000, 1) for x in xs]
    over = lambda xs: round(statistics.median(xs) / statistics.median(serve_ttft) - 1, 3)
    result["ttft_ms"] = {"ray_p50": p50(ray_ttft), "ray_1node_p50": p50(one_ttft), "serve_p50": p50(serve_ttft),
                         "overhead": over(one_ttft), "overhead_3nodes": over(ray_ttft),
                         "ray": ms(ray_ttft), "ray_1node": ms(one_ttft), "serve": ms(serve_ttft)}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "ray_deploy.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "ttft_ms"} | {"ttft_p50_ms": {
        k: result["ttft_ms"][k] for k in ("ray_p50", "ray_1node_p50", "serve_p50", "overhead", "overhead_3nodes")}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

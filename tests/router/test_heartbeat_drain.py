"""A worker's draining heartbeat (SIGTERM, ``worker/drain.py``) at a real router: it stays
registered but leaves the routable set at once (here the only prefill worker, so the router
computes prompts on the decode worker, and admission forgets its slots); its last heartbeat (``healthy=False,
draining=True``) removes it as ``drained``, not ``unhealthy``."""

import httpx

from tests.conftest import AUTH, free_port, metric, serve_process


def test_a_draining_heartbeat_takes_the_worker_out_of_routing_and_its_last_one_removes_it():
    ns = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}
    with serve_process("--route-policy", "pd", command="router") as router:
        for wid, role in (("p", "prefill"), ("d", "decode")):
            body = {"worker_id": wid, "role": role, "url": f"http://127.0.0.1:{free_port()}", "namespace": ns,
                    "max_num_seqs": 4, "kv_capacity_tokens": 4096}
            assert httpx.post(router + "/internal/register", json=body, headers=AUTH, timeout=5).status_code == 200

        def beat(**fields):
            r = httpx.post(router + "/internal/heartbeat", json={"worker_id": "p", **fields}, headers=AUTH, timeout=5)
            return r.status_code, r.json()

        def cluster():
            return httpx.get(router + "/v1/cluster", headers=AUTH, timeout=5).json()

        assert path(router) == ["p", "d"]
        assert beat(draining=False) == (200, {"ok": True, "role": "prefill"}) and cluster()["admission"]["slots"] == {"p": 4, "d": 4}
        assert beat(draining=True, running=1) == (200, {"ok": True, "role": "prefill", "in_flight": 0})   # nothing routed to it
        assert path(router) == ["d"]      # out of every path: with no prefill worker, d computes prompts
        ws = {w["worker_id"]: w for w in cluster()["workers"]}
        assert (ws["p"]["draining"], ws["d"]["draining"]) == (True, False)
        assert cluster()["admission"]["slots"] == {"d": 4}
        assert beat(draining=True) == (200, {"ok": True, "role": "prefill", "in_flight": 0})   # again: still draining
        assert beat(draining=True, healthy=False, detail="drained") == (200, {"ok": True})   # it left
        assert [w["worker_id"] for w in cluster()["workers"]] == ["d"]
        assert metric(router, "warmpath_router_workers_dropped_total", reason="drained") == 1
        assert metric(router, "warmpath_router_workers_dropped_total", reason="unhealthy") in (None, 0)
        assert beat(draining=True)[0] == 404                                 # unknown now


def path(router):
    """``/ready``'s path for a probe request (the workers that would compute and decode it)."""
    r = httpx.get(router + "/ready", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()["path"]

"""Two real router processes that are each other's ``--peer``: a router that starts follows
the workers its peer knows at once; each counts the other in the fleet limit while it
reports and stops counting it when it goes silent; with elastic roles on, only the router
whose URL sorts first decides roles and the other follows the role a worker's heartbeat
says; bad peer reports get a 4xx."""


import httpx

from tests.conftest import AUTH, free_port, serve_process, wait_for

NS = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}


def cluster(url: str) -> dict:
    return httpx.get(url + "/v1/cluster", headers=AUTH, timeout=5).json()


def test_peer_routers_share_workers_and_the_limit_and_follow_worker_roles():
    pa, pb = free_port(), free_port()
    a_url, b_url = f"http://127.0.0.1:{pa}", f"http://127.0.0.1:{pb}"
    peer = ("--peer-every-s", "0.1", "--peer-alive-s", "0.5", "--route-policy", "cpd", "--elastic", "on")
    with serve_process("--peer", b_url, *peer, command="router", port=pa) as a:
        for wid, role in (("p", "prefill"), ("d", "decode")):
            body = {"worker_id": wid, "role": role, "url": f"http://127.0.0.1:{free_port()}", "namespace": NS,
                    "max_num_seqs": 5, "kv_capacity_tokens": 4096}
            assert httpx.post(a + "/internal/register", json=body, headers=AUTH, timeout=5).status_code == 200
        assert cluster(a)["admission"]["max_in_flight"] == 10 and cluster(a)["admission"]["routers"] == 1
        with serve_process("--peer", a_url, "--peer", b_url, *peer, command="router", port=pb) as b:   # itself: skipped
            # b read a's registrations when it started: both workers, at once
            assert sorted(w["worker_id"] for w in cluster(b)["workers"]) == ["d", "p"]
            wait_for(lambda: cluster(a)["admission"]["routers"] == 2, 5)
            assert cluster(a)["admission"]["max_in_flight"] == 5             # ceil(10 / 2)
            wait_for(lambda: cluster(b)["admission"]["max_in_flight"] == 5, 5)
            seen = cluster(a)["routers"]
            assert [(r["url"], r["alive"]) for r in seen] == [(a_url, True), (b_url, True)]
            assert cluster(a)["routers_agree"]
            # the router whose URL sorts first decides roles; the other takes a worker's heartbeat role
            leader, follower = sorted((a, b))
            beat = {"worker_id": "p", "role": "pre-prefill"}
            assert httpx.post(follower + "/internal/heartbeat", json=beat, headers=AUTH, timeout=5).json()["role"] == "pre-prefill"
            assert httpx.post(leader + "/internal/heartbeat", json=beat, headers=AUTH, timeout=5).json()["role"] == "prefill"
            assert {w["worker_id"]: w["role"] for w in cluster(follower)["workers"]} == {"p": "pre-prefill", "d": "decode"}
            assert {w["worker_id"]: w["role"] for w in cluster(leader)["workers"]} == {"p": "prefill", "d": "decode"}
            # peer reports are typed and need the cluster token
            assert httpx.post(a + "/internal/peer", json={"router": b_url}, timeout=5).status_code == 401
            bad = {"router": b_url, "loads": {"p": {"running": -1}}}
            assert httpx.post(a + "/internal/peer", json=bad, headers=AUTH, timeout=5).status_code == 400
            assert httpx.post(a + "/internal/peer", json={"router": "nope"}, headers=AUTH, timeout=5).status_code == 400
            # a session turn that ended on a peer: this router now knows the session and where its KV is
            turn = {"router": b_url, "turns": [{"session": "user:s", "decode": "d", "context_tokens": 50, "turns": 1}]}
            assert cluster(a)["sessions"] == 0
            assert httpx.post(a + "/internal/peer", json=turn, headers=AUTH, timeout=5).status_code == 200
            assert cluster(a)["sessions"] == 1
        # b stopped: a takes the whole limit back once b is silent past --peer-alive-s
        wait_for(lambda: cluster(a)["admission"]["max_in_flight"] == 10, 5)
        assert [(r["url"], r["alive"]) for r in cluster(a)["routers"]] == [(a_url, True), (b_url, False)]


def test_decide_answers_where_a_request_would_go_without_sending_it():
    with serve_process("--route-policy", "pd", command="router") as r:
        for wid, role in (("p", "prefill"), ("d", "decode")):
            body = {"worker_id": wid, "role": role, "url": f"http://127.0.0.1:{free_port()}", "namespace": NS,
                    "max_num_seqs": 5, "kv_capacity_tokens": 4096}
            assert httpx.post(r + "/internal/register", json=body, headers=AUTH, timeout=5).status_code == 200
        ask = {"prompt": list(range(100, 164)), "max_tokens": 4}
        got = httpx.post(r + "/internal/decide", json=ask, headers=AUTH, timeout=5)
        assert got.status_code == 200, got.text
        assert (got.json()["prefill"], got.json()["decode"], got.json()["cached_tokens"]) == ("p", "d", 0)
        assert cluster(r)["admission"]["in_flight"] == 0 and cluster(r)["sessions"] == 0   # nothing sent, nothing kept
        assert httpx.post(r + "/internal/decide", json=ask, timeout=5).status_code == 401
        assert httpx.post(r + "/internal/decide", json={"prompt": [], "max_tokens": 4}, headers=AUTH,
                          timeout=5).status_code == 400

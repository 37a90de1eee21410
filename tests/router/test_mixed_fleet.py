"""One router over two engines' KV namespaces, with real processes: the router, a warmpath
replica (w1, its own events) and a worker registered in vLLM's namespace (v0: 32-token blocks,
its index fed by the real vLLM event relay from hand-made batches in vLLM 0.32's wire shape;
its answers computed by a second real warmpath server standing in for the vLLM server, which
tests/vllm/ runs for real). Each request goes to the worker holding most of its prompt in that
worker's own namespace; P/D roles are refused to a second namespace. Index fidelity: the
router's ``/internal/kv/held`` against the relay's truth (what vLLM's events say is cached)."""

import dataclasses
import threading
import time
from contextlib import contextmanager

import httpx
import msgpack
import uvicorn
import zmq

from tests.conftest import AUTH, CLUSTER_TOKEN, free_port, serve_processes, server
from tests.router.test_router_http import wait_for

M = "SmolLM2-135M-Instruct"


def vllm_batch(seq: int, tokens: list[int]) -> list[bytes]:
    """vLLM's PUB frames: topic, sequence number, a KVEventBatch of one BlockStored (opaque hashes)."""
    hashes = [bytes([i + 1]) * 32 for i in range(len(tokens) // 32)]
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": tokens,
          "block_size": 32, "lora_id": None, "medium": "GPU", "lora_name": None}
    return [b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), [ev], 0], use_bin_type=True)]


@contextmanager
def served(app):
    """``app`` on a free loopback port, uvicorn in a thread; its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def check_fidelity(router: str, relay, pub, seq: int) -> None:
    """v0's index against the relay's truth (10 blocks of prompt A cached): all held, by one
    sample and by the sampler's thread over HTTP (the truth on a vLLM worker's app); a block
    vLLM cached whose parent the relay never saw is cached and not held (10 of 11); the
    route's guards."""
    from benchmarks.peers.vllm_fidelity import FidelitySampler, sample_worker
    from warmpath.vllm.app import FrontConfig, build_vllm_front
    from warmpath.vllm.load import RelayBook

    def ask(worker: str, keys: list[str]) -> dict:
        r = httpx.post(router + "/internal/kv/held", json={"worker_id": worker, "keys": keys}, headers=AUTH, timeout=5)
        assert r.status_code == 200, r.text
        return r.json()

    s = sample_worker("v0", relay.cached, ask, 1.0)
    assert (s.truth, s.held, s.unkeyed, s.share, s.stale, s.mirror_mismatch) == (10, 10, 0, 1.0, False, 0)
    # the sampler's thread over HTTP: the relay's truth on a vLLM worker's real HTTP face
    front = build_vllm_front(FrontConfig("http://127.0.0.1:9", M, 2048, cluster_token=CLUSTER_TOKEN), lambda: True,
                             relay.stats, RelayBook(), relay.cached)
    with served(front) as url:
        sampler = FidelitySampler(router, CLUSTER_TOKEN, every_s=0.2, workers={"v0": url}).start()
        time.sleep(1.5)
        out = sampler.stop()
    n = out["all"]["samples"]
    assert out["errors"] == [] and n >= 3 and out["all"]["truth_blocks"] == out["all"]["held_blocks"] == 10 * n
    assert (out["all"]["min"], out["all"]["mean"], out["lost_batches"], out["mirror_mismatch"]) == (1.0, 1.0, 0, 0)
    keys = list(relay.cached()["keys"])
    assert ask("v0", keys[:3] + ["ab" * 16]) == {
        "worker_id": "v0", "asked": 4, "held": 3, "missing": [3], "indexed": 10, "stale": False, "mirror_mismatch": 0}
    orphan = {"type": "BlockStored", "block_hashes": [b"\x77" * 32], "parent_block_hash": b"\x78" * 32,
              "token_ids": list(range(32)), "block_size": 32, "medium": "GPU"}
    pub.send_multipart([b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), [orphan], 0])])
    wait_for(lambda: len(relay.truth) == 11)
    s = sample_worker("v0", relay.cached, ask, 2.0)
    assert (s.truth, s.held, s.unkeyed, s.share) == (11, 10, 1, 10 / 11)
    for body, headers, code in (({"worker_id": "v0", "keys": keys}, {}, 401),
                                ({"worker_id": "nobody", "keys": keys}, AUTH, 404),
                                ({"worker_id": "v0", "keys": ["xyz"]}, AUTH, 400)):
        assert httpx.post(router + "/internal/kv/held", json=body, headers=headers, timeout=5).status_code == code


def test_one_router_serves_both_namespaces_by_cached_tokens_in_each(smollm):
    from warmpath.vllm.event_relay import EventRelay
    from warmpath.vllm.model_dir import vllm_model_dir
    from warmpath.vllm.worker import namespace

    rport = free_port()
    router_url = f"http://127.0.0.1:{rport}"
    ns_v = namespace(M, vllm_model_dir("smollm2"), "auto", 32)
    relay = EventRelay(ns_v, "v0", token=CLUSTER_TOKEN).start()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.connect(relay.vllm_endpoint)                          # as vLLM's PUB does
    try:
        with serve_processes(
                server(command="router", port=rport),
                server("--no-l3", "--router", router_url, "--worker-id", "w1", "--heartbeat-s", "0.3",
                       command="worker"),
                server("--no-l3")) as (router, w1, stand_in):
            def cluster():
                return {w["worker_id"]: w for w in httpx.get(router + "/v1/cluster", timeout=5).json()["workers"]}

            wait_for(lambda: "w1" in cluster())
            reg = {"worker_id": "v0", "role": "replica", "url": stand_in, "namespace": dataclasses.asdict(ns_v),
                   "events_endpoint": relay.pub.endpoint, "replay_endpoint": relay.pub.replay_endpoint,
                   "kv_bytes_per_token": 23040, "max_num_seqs": 8}
            r = httpx.post(router + "/internal/register", json=reg, headers=AUTH, timeout=5)
            assert r.status_code == 200, r.text
            assert cluster()["v0"]["kv_namespace"] == {"revision": ns_v.revision, "dtype": "vllm-auto", "block_size": 32}
            assert cluster()["w1"]["kv_namespace"]["block_size"] == 16
            # vLLM stored prompt A's 10 blocks of 32: v0 holds A in its namespace, w1 nothing
            a = smollm.tokenizer.encode("A vLLM worker holds this context. " * 60)[:320]
            seq = 0
            time.sleep(0.5)                                   # the PUB's connection is up
            while cluster()["v0"]["indexed_blocks"] < 10:
                pub.send_multipart(vllm_batch(seq, a))
                seq += 1
                time.sleep(0.5)
                assert seq < 20, "the relay's re-keyed events never reached the router's index"
            check_fidelity(router, relay, pub, seq)
            body = {"model": M, "prompt": a + [5, 6, 7], "max_tokens": 2, "temperature": 0}
            r = httpx.post(router + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200 and r.headers["x-warmpath-worker"] == "v0"
            assert float(r.headers["x-warmpath-predicted-ttft-s"]) > 0
            # prompt B computed on w1 (its own events, warmpath's namespace): B's next turn goes to w1
            b = smollm.tokenizer.encode("A warmpath replica holds this other context. " * 60)[:320]
            assert httpx.post(w1 + "/v1/completions", json={**body, "prompt": b}, headers=AUTH, timeout=120).status_code == 200
            wait_for(lambda: cluster()["w1"]["indexed_blocks"] >= 19)
            r = httpx.post(router + "/v1/completions", json={**body, "prompt": b + [9]}, timeout=120)
            assert r.headers["x-warmpath-worker"] == "w1"
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 304
            # v0 restarted (another pid): the router replaces it and keeps its namespace
            assert httpx.post(router + "/internal/register", json={**reg, "pid": 4242}, headers=AUTH,
                              timeout=5).status_code == 200
            assert cluster()["v0"]["kv_namespace"]["block_size"] == 32
            # P/D roles stay in one namespace; another model is refused outright
            p0 = {**reg, "worker_id": "p0", "role": "prefill", "url": f"http://127.0.0.1:{free_port()}",
                  "namespace": dataclasses.asdict(ns_v), "events_endpoint": None, "replay_endpoint": None}
            ok = httpx.post(router + "/internal/register", json=p0, headers=AUTH, timeout=5)
            assert ok.status_code == 200                     # the first P/D worker (w1 is a replica): allowed
            d0 = {**p0, "worker_id": "d0", "role": "decode",
                  "namespace": {**dataclasses.asdict(ns_v), "revision": "another-engine", "block_size": 16}}
            bad = httpx.post(router + "/internal/register", json=d0, headers=AUTH, timeout=5)
            assert bad.status_code == 400 and "handoff never crosses namespaces" in bad.json()["error"]["message"]
            other = {**p0, "worker_id": "x", "role": "replica", "namespace": {**dataclasses.asdict(ns_v), "model_id": "Other"}}
            bad = httpx.post(router + "/internal/register", json=other, headers=AUTH, timeout=5)
            assert bad.status_code == 400 and "different model" in bad.json()["error"]["message"]
    finally:
        pub.close(0)
        relay.close()

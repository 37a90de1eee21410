"""Index fidelity's arithmetic (``warmpath/vllm/fidelity.py``), hand-worked: the share, the
blocks cached in both reads around the router's answer, one sample, the summary; and a vLLM
worker's ``/internal/kv/cached`` on its real app, fed by a real event relay."""

import time

import msgpack
import pytest
import zmq
from fastapi.testclient import TestClient

from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks
from warmpath.vllm.fidelity import Sample, fidelity, sample, stable, summarize

NS = KVNamespace("SmolLM2-135M-Instruct", "vllm:test", "vllm-auto", 4, "tok")


def test_share_is_held_over_cached():
    assert fidelity(200, 199) == 0.995 and fidelity(3, 3) == 1.0 and fidelity(0, 0) is None
    for truth, held in ((3, 4), (-1, 0), (2, -1)):
        with pytest.raises(ValueError):
            fidelity(truth, held)


def read(keys: dict, unkeyed: list, lost: int = 0) -> dict:
    return {"worker_id": "v0", "blocks": sum(keys.values()) + len(unkeyed), "keys": keys, "unkeyed": unkeyed,
            "other_medium": 0, "unmatched_removes": 0, "lost_batches": lost, "malformed_batches": 0}


def test_only_blocks_cached_in_both_reads_count():
    first = read({"a": 1, "b": 2, "c": 1}, ["x", "y"])
    second = read({"b": 1, "c": 1, "d": 1}, ["y", "z"])           # a evicted, d stored between the reads
    assert stable(first, second) == ({"b": 1, "c": 1}, 1)
    # the router was asked a, b, c (first read's order) and misses c: b held; c and y (unkeyed) not
    s = sample(4.0, first, ["a", "b", "c"], {"missing": [2], "stale": False, "mirror_mismatch": 0}, second)
    assert s == Sample(4.0, "v0", truth=3, held=1, unkeyed=1, share=1 / 3)


def test_summary_over_samples_with_blocks_cached():
    xs = [Sample(0.0, "v0", 0, 0, 0, None), Sample(2.0, "v0", 10, 10, 0, 1.0),
          Sample(2.0, "v1", 10, 9, 1, 0.9, lost_batches=2), Sample(4.0, "v1", 4, 2, 0, 0.5, lost_batches=3)]
    s = summarize(xs)
    # shares 1.0, 0.9, 0.5 → sorted 0.5, 0.9, 1.0: p1 at position 0.02 = 0.5 + 0.4 × 0.02
    assert s["all"] == {"samples": 3, "min": 0.5, "p1": 0.508, "median": 0.9, "mean": 0.8,
                        "truth_blocks": 24, "held_blocks": 21, "unkeyed_blocks": 1}
    assert s["workers"]["v0"] == {"samples": 1, "min": 1.0, "p1": 1.0, "median": 1.0, "mean": 1.0}
    assert s["workers"]["v1"]["mean"] == 0.7
    assert (s["empty_samples"], s["lost_batches"], s["worst"]["t"], len(s["samples"])) == (1, 3, 4.0, 4)
    assert summarize([])["all"]["samples"] == 0


def test_a_vllm_workers_cached_blocks_route_takes_the_cluster_token():
    from warmpath.vllm.app import FrontConfig, build_vllm_front
    from warmpath.vllm.event_relay import EventRelay
    from warmpath.vllm.load import RelayBook

    relay = EventRelay(NS, "v0", token="sekrit").start()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.connect(relay.vllm_endpoint)                                 # as vLLM's PUB does
    try:
        ev = {"type": "BlockStored", "block_hashes": [b"\x01" * 32, b"\x02" * 32], "parent_block_hash": None,
              "token_ids": list(range(8)), "block_size": 4, "medium": "GPU"}
        orphan = {**ev, "block_hashes": [b"\x03" * 32], "parent_block_hash": b"\x09" * 32, "token_ids": [1, 2, 3, 4]}
        deadline = time.time() + 20
        while len(relay.truth) < 3:
            pub.send_multipart([b"", (0).to_bytes(8, "big"), msgpack.packb([time.time(), [ev, orphan]])])
            time.sleep(0.3)
            assert time.time() < deadline, "the relay never read the batch"
        app = build_vllm_front(FrontConfig("http://127.0.0.1:9", "M", 64, cluster_token="sekrit"), lambda: True,
                               relay.stats, RelayBook(), relay.cached)
        c = TestClient(app)
        assert c.get("/internal/kv/cached").status_code == 401
        got = c.get("/internal/kv/cached", headers={"Authorization": "Bearer sekrit"}).json()
        k = [h.hex() for h in hash_prefix_blocks(NS, list(range(8)))]
        assert got == {"worker_id": "v0", "blocks": 3, "keys": {k[0]: 1, k[1]: 1}, "unkeyed": ["03" * 32],
                       "other_medium": 0, "unmatched_removes": 0, "lost_batches": 0, "malformed_batches": 0}
        assert relay.stats()["cached_blocks"] == 3
    finally:
        pub.close(0)
        relay.close()

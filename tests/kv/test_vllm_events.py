"""vLLM's KV event batches (hand-made msgpack in vLLM 0.32's exact wire shape) decoded and
re-keyed to warmpath's block keys; the binding subscriber with vLLM's replay protocol."""

import threading
import time

import msgpack
import pytest
import zmq

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks
from warmpath.kv.vllm_events import (VLLMEventSubscriber, VLLMKeyRebuilder, decode_vllm_batch,
                                     decode_vllm_event, vllm_binds)

NS = KVNamespace("SmolLM2-135M-Instruct", "vllm:test", "vllm-auto", 4, "tok")
H = [bytes([i]) * 32 for i in range(1, 9)]          # vLLM's sha256 block hashes (opaque)


def stored(hashes, parent, tokens, bs=4, medium="GPU"):
    """A ``BlockStored`` as vLLM 0.32 encodes it (a tagged map; defaults omitted)."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": bs, "lora_id": None, "medium": medium, "lora_name": None}


def batch(*events, ts=1.5, dp=0):
    return msgpack.packb([ts, list(events), dp], use_bin_type=True)


def test_decode_a_batch_in_vllm_032_shape():
    payload = batch(stored(H[:2], None, list(range(8))), {"type": "BlockRemoved", "block_hashes": [H[0]],
                                                          "medium": "GPU"}, {"type": "AllBlocksCleared"})
    ts, events, dp = decode_vllm_batch(payload)
    assert (ts, dp) == (1.5, 0)
    assert events == [BlockStored(H[:2], None, list(range(8)), 4, "GPU", None),
                      BlockRemoved([H[0]], "GPU"), AllBlocksCleared()]


def test_decode_older_array_events_and_int_hashes():
    e = decode_vllm_event(["BlockStored", [11, 12], 10, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU"])
    assert e == BlockStored([11, 12], 10, [1, 2, 3, 4, 5, 6, 7, 8], 4, "GPU", None)
    assert decode_vllm_event(["BlockRemoved", [11]]) == BlockRemoved([11], None)


@pytest.mark.parametrize("bad", [["Nope"], {"type": "BlockStored", "block_hashes": "x", "parent_block_hash": None,
                                            "token_ids": [], "block_size": 4},
                                 {"type": "BlockRemoved", "block_hashes": [[1]]}, 7, []])
def test_malformed_events_are_refused(bad):
    with pytest.raises(ValueError):
        decode_vllm_event(bad)
    with pytest.raises(ValueError):
        decode_vllm_batch(msgpack.packb({"not": "a batch"}))


def test_rebuilt_keys_are_the_routers_hash_chain():
    tokens = list(range(100, 112))        # 3 blocks of 4
    want = hash_prefix_blocks(NS, tokens)
    r = VLLMKeyRebuilder(NS)
    _, ev1, _ = decode_vllm_batch(batch(stored(H[:2], None, tokens[:8])))
    _, ev2, _ = decode_vllm_batch(batch(stored([H[2]], H[1], tokens[8:])))
    assert r.translate(ev1) == [BlockStored(want[:2], None, tokens[:8], 4, "L1")]
    assert r.translate(ev2) == [BlockStored([want[2]], want[1], tokens[8:], 4, "L1")]
    assert want[0].hex() == hash_prefix_blocks(NS, tokens[:4])[0].hex() and len(want[0]) == 16
    # removal maps back through vLLM's hashes; unknown hashes are ignored
    assert r.translate([BlockRemoved([H[2], H[7]], "GPU")]) == [BlockRemoved([want[2]], "L1")]
    # host (offloaded) blocks are L2; other media are counted, not indexed
    assert r.translate([BlockStored([H[3]], H[1], tokens[8:], 4, "CPU")]) == [
        BlockStored([want[2]], want[1], tokens[8:], 4, "L2")]
    assert r.translate([BlockStored([H[4]], None, tokens[:4], 4, "STORAGE"), AllBlocksCleared()]) == [
        AllBlocksCleared()]
    s = r.stats
    assert (s.stored, s.removed, s.other_medium, s.orphans) == (4, 1, 1, 0)


def test_orphans_wrong_block_size_and_token_counts_are_counted_not_keyed():
    r = VLLMKeyRebuilder(NS)
    assert r.translate([BlockStored([H[5]], H[6], [1, 2, 3, 4], 4, "GPU"),      # parent never seen
                        BlockStored([H[0]], None, list(range(16)), 16, "GPU"),  # vLLM's block size ≠ ours
                        BlockStored(H[:2], None, [1, 2, 3, 4, 5], 4, "GPU"),    # not 2 × 4 tokens
                        BlockStored([H[0]], None, [1, 2, 3, -1], 4, "GPU")]) == []  # not a u32 token id
    s = r.stats
    assert (s.orphans, s.bad_block_size, s.bad_tokens, s.stored) == (1, 1, 3, 0)
    with pytest.raises(ValueError):
        VLLMKeyRebuilder(NS, max_blocks=0)


def test_the_map_is_a_bounded_lru():
    r = VLLMKeyRebuilder(NS, max_blocks=2)
    r.translate([BlockStored(H[:3], None, list(range(12)), 4, "GPU")])
    assert list(r.keys) == H[1:3]


def test_bind_rule_mirrors_vllm():
    assert vllm_binds("tcp://*:5557") and vllm_binds("ipc:///tmp/x") and vllm_binds("tcp://[::]:1")
    assert not vllm_binds("tcp://127.0.0.1:5557") and not vllm_binds("tcp://0.0.0.0:5557")


def _vllm_replay(router, buffered, stop):
    """vLLM's replay ROUTER (``ZmqEventPublisher._service_replay``), serving ``buffered``."""
    while not stop.is_set():
        if not router.poll(50):
            continue
        ident, _, start = router.recv_multipart()
        for seq, payload in buffered:
            if seq >= int.from_bytes(start, "big"):
                router.send_multipart([ident, b"", b"", seq.to_bytes(8, "big"), payload])
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])


def test_subscriber_binds_reads_in_order_and_fills_a_gap_from_vllms_replay():
    ctx = zmq.Context.instance()
    replay = ctx.socket(zmq.ROUTER)
    replay.setsockopt(zmq.LINGER, 0)
    rport = replay.bind_to_random_port("tcp://127.0.0.1")
    sub = VLLMEventSubscriber("tcp://127.0.0.1:*", f"tcp://127.0.0.1:{rport}")
    pub = ctx.socket(zmq.PUB)                 # vLLM's PUB connects to the subscriber
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(sub.endpoint)
    payloads = [batch(stored([H[i]], H[i - 1] if i else None, [i] * 4)) for i in range(4)]
    stop = threading.Event()
    t = threading.Thread(target=_vllm_replay, args=(replay, list(enumerate(payloads)), stop), daemon=True)
    t.start()
    try:
        # NOTE: a bound SUB sends its subscription to a connecting PUB only once its own thread
        # uses the socket (as the relay's polling thread does); until then the PUB drops
        assert sub.poll(300) == []
        pub.send_multipart([b"", (0).to_bytes(8, "big"), payloads[0]])
        got = sub.poll(2000)
        assert [s for s, _ in got] == [0]
        pub.send_multipart([b"", (3).to_bytes(8, "big"), payloads[3]])   # 1 and 2 were lost
        pub.send_multipart([b"", b"short", payloads[3]])
        got = sub.poll(2000)
        assert [s for s, _ in got] == [1, 2, 3] and (sub.replays, sub.lost) == (1, 0)
        assert got[2][1] == [BlockStored([H[3]], H[2], [3] * 4, 4, "GPU", None)]
        time.sleep(0.1)
        assert sub.poll(200) == [] and sub.malformed == 1
    finally:
        stop.set()
        t.join(2)
        pub.close()
        replay.close()
        sub.close()

import time

import msgpack

from warmpath.kv.events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventPublisher,
                                KVEventSubscriber)


def test_publish_subscribe_and_replay_after_gap():
    pub = KVEventPublisher("w1")
    sub = KVEventSubscriber(pub.endpoint, pub.replay_endpoint)
    try:
        time.sleep(0.3)  # let PUB/SUB connect
        assert pub.publish([BlockStored([b"a" * 16], None, [1, 2], 2, "L1")]) == 0
        got = sub.poll(2000)
        assert [(s, w) for s, _, w in got] == [(0, "w1")]
        assert got[0][1] == [BlockStored([b"a" * 16], None, [1, 2], 2, "L1")]
        # Batch 1 is buffered but never reaches the subscriber (a dropped message).
        lost = msgpack.packb([time.time(), [BlockRemoved([b"a" * 16], "L1").encode()], "w1"])
        pub._buf.append((1, lost))
        pub._seq = 2
        pub.publish([AllBlocksCleared()])
        got = sub.poll(2000)
        assert [s for s, _, _ in got] == [1, 2] and sub.replays == 1
        assert got[0][1] == [BlockRemoved([b"a" * 16], "L1")]
        assert got[1][1] == [AllBlocksCleared()]
        assert pub.publish([]) is None
    finally:
        sub.close()
        pub.close()


def test_malformed_batches_and_replay_requests_are_skipped_not_fatal():
    import zmq

    pub = KVEventPublisher("w1")
    sub = KVEventSubscriber(pub.endpoint, pub.replay_endpoint)
    try:
        time.sleep(0.3)
        with pub._lock:   # raw frames on the PUB socket, as a buggy or hostile peer would send
            pub.pub.send_multipart([b"kv-events", b"short"])
            pub.pub.send_multipart([b"kv-events", (0).to_bytes(8, "big"), b"\xc1 not msgpack"])
            pub.pub.send_multipart([b"kv-events", (0).to_bytes(8, "big"), msgpack.packb([0, [["Nope"]], "w1"])])
        assert pub.publish([BlockStored([b"b" * 16], None, [3, 4], 2, "L2")]) == 0
        got = sub.poll(2000)
        assert [(s, e) for s, e, _ in got] == [(0, [BlockStored([b"b" * 16], None, [3, 4], 2, "L2")])]
        assert sub.malformed == 3
        # a malformed replay request is ignored; a good one is still answered
        d = zmq.Context.instance().socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(pub.replay_endpoint)
        d.send_multipart([b"", b"xx", b"yy"])
        time.sleep(0.2)
        d.close()
        assert [s for s, _, _ in sub.replay(0)] == [0] and pub.malformed == 1
    finally:
        sub.close()
        pub.close()

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


def test_a_late_subscriber_gets_the_held_blocks_then_only_later_batches():
    """The snapshot is the fold of every batch (hand-worked below), even after the replay
    buffer wrapped, and it carries the sequence number it covers."""
    a, b, c, d = (bytes([i]) * 16 for i in range(4))
    pub = KVEventPublisher("w1", buffer_batches=2)
    try:
        pub.publish([BlockStored([a, b], None, [1, 2, 3, 4], 2, "L1")])      # L1 {a, b}
        pub.publish([BlockStored([c], a, [5, 6], 2, "L3")])                  # L3 {c}
        pub.publish([BlockRemoved([a], "L1"), BlockStored([d], None, [7, 8], 2, "L2")])  # L1 {b}, L2 {d}
        pub.publish([AllBlocksCleared(), BlockStored([a], None, [1, 2], 2, "L2")])        # L1 {}, L2 {a}
        assert [s for s, _ in pub._buf] == [2, 3]     # batches 0 and 1 are gone from the buffer
        sub = KVEventSubscriber(pub.endpoint, pub.replay_endpoint)
        try:
            time.sleep(0.3)
            held = sub.snapshot()
            assert held == [BlockStored([a], None, [], 0, "L2"), BlockStored([c], None, [], 0, "L3")]
            assert sub.next_seq == 4
            pub.publish([BlockRemoved([c], "L3")])
            got = sub.poll(2000)
            assert [(s, e) for s, e, _ in got] == [(4, [BlockRemoved([c], "L3")])] and sub.replays == 1
        finally:
            sub.close()
    finally:
        pub.close()


def test_a_snapshot_of_a_publisher_that_published_nothing_starts_at_batch_zero():
    pub = KVEventPublisher("w1")
    sub = KVEventSubscriber(pub.endpoint, pub.replay_endpoint)
    try:
        assert sub.snapshot() == [] and sub.next_seq == 0
    finally:
        sub.close()
        pub.close()

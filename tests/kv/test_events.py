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

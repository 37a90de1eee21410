"""KV events with a cluster token: real ZeroMQ sockets on 127.0.0.1, PLAIN + a ZAP handler."""

import time

from warmpath.kv.events import BlockStored, KVEventPublisher, KVEventSubscriber

TOKEN = "a-cluster-token"


def test_only_a_subscriber_with_the_token_receives_events_and_replays():
    pub = KVEventPublisher("w1", token=TOKEN)
    good = KVEventSubscriber(pub.endpoint, pub.replay_endpoint, token=TOKEN)
    anonymous = KVEventSubscriber(pub.endpoint, pub.replay_endpoint)
    wrong = KVEventSubscriber(pub.endpoint, pub.replay_endpoint, token="not-the-token")
    subs = (good, anonymous, wrong)
    try:
        time.sleep(0.5)   # let the handshakes (and refusals) happen
        for i in range(3):
            pub.publish([BlockStored([bytes([i]) * 16], None, [1, 2], 2, "L1")])
        got = good.poll(2000)
        while len(got) < 3 and (more := good.poll(1000)):
            got += more
        assert [(s, w) for s, _, w in got] == [(0, "w1"), (1, "w1"), (2, "w1")]
        assert got[2][1] == [BlockStored([b"\x02" * 16], None, [1, 2], 2, "L1")]
        assert anonymous.poll(1000) == [] and wrong.poll(1000) == []
        # the replay socket is guarded too
        assert [s for s, _, _ in good.replay(1)] == [1, 2]
        assert anonymous.replay(0, timeout_ms=1000) == [] and wrong.replay(0, timeout_ms=1000) == []
    finally:
        for s in subs:
            s.close()
        pub.close()


def test_without_a_token_events_stay_open():
    pub = KVEventPublisher("w2")
    sub = KVEventSubscriber(pub.endpoint, pub.replay_endpoint)
    try:
        time.sleep(0.3)
        pub.publish([BlockStored([b"x" * 16], None, [3], 1, "L2")])
        assert [(s, w) for s, _, w in sub.poll(2000)] == [(0, "w2")]
    finally:
        sub.close()
        pub.close()

import pytest

from warmpath.routing.registry import DiscoveryConfig, Registry


def test_register_heartbeat_expire():
    r = Registry(DiscoveryConfig(heartbeat_s=10, drop_after_s=30))
    r.register("p1", "prefill", "http://127.0.0.1:9001", now=0)
    r.register("d1", "decode", "http://127.0.0.1:9002", now=0, events_endpoint="tcp://127.0.0.1:7000")
    assert r.heartbeat("p1", now=20, queued_prefill_tokens=300, prefill_tok_s=650.0)
    v = {w.worker_id: w for w in r.views()}
    assert v["p1"].queued_prefill_tokens == 300 and v["p1"].prefill_tok_s == 650.0
    assert r.expire(now=31) == ["d1"]          # silent since 0
    assert r.expire(now=50) == []               # p1 seen at 20
    assert r.expire(now=51) == ["p1"]
    assert not r.heartbeat("p1", now=52)        # must register again


def test_silent_workers_are_looked_for_every_quarter_heartbeat_at_most_once_a_second():
    assert DiscoveryConfig(heartbeat_s=1, drop_after_s=1.5).check_every_s == 0.25   # dropped by 1.75 s
    assert DiscoveryConfig(heartbeat_s=10, drop_after_s=30).check_every_s == 1.0


def test_bad_input():
    r = Registry()
    with pytest.raises(ValueError, match="role"):
        r.register("x", "oracle", "http://h", now=0)
    r.register("x", "decode", "http://a", now=0)
    with pytest.raises(ValueError, match="already registered"):
        r.register("x", "decode", "http://b", now=1)
    r.register("x", "decode", "http://b", now=100)   # the old one is long gone: a restart
    with pytest.raises(ValueError, match="unknown heartbeat"):
        r.heartbeat("x", now=101, gpu_temp=80)
    with pytest.raises(ValueError):
        DiscoveryConfig(heartbeat_s=10, drop_after_s=5)

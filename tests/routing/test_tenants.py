"""Tenants, priorities and VTC (routing/tenants.py, routing/fair_queue.py, the admission's
use of them): hand-worked counters and orders."""

import pytest

from warmpath.routing.admission import Admission, AdmissionConfig
from warmpath.routing.fair_queue import FairQueue, Waiter
from warmpath.routing.tenants import (TenantConfig, TenantLimit, TokenBucket, VirtualCounters, priority_of,
                                      request_cost, split_keys)


def test_a_request_costs_what_its_path_computes_loads_and_decodes():
    assert request_cost(computed=1000, loaded=0, decode=100) == 1200.0      # a cold prompt
    assert request_cost(computed=100, loaded=900, decode=100) == 390.0      # the same prompt, 900 loaded
    assert request_cost(computed=100, loaded=0, decode=100) == 300.0        # 900 already in L1: free


def test_vtc_serves_the_least_served_and_banks_no_idle_credit():
    v = VirtualCounters({"b": 2.0})
    v.charge("a", 300)
    v.charge("b", 300)                       # weight 2: counts half
    assert v.counters == {"a": 300.0, "b": 150.0} and v.pick(["a", "b"]) == "b"
    v.lift("c", ["a", "b"])                  # c starts waiting beside a and b: lifted to the least, 150
    assert v.counters["c"] == 150.0 and v.pick(["a", "b", "c"]) == "b"   # ties by name
    v.lift("d", [])                          # nobody waits: lifted to the highest of all
    assert v.counters["d"] == 300.0
    v.charge("a", -100)                      # a refund
    assert v.counters["a"] == 200.0


def test_the_fair_queue_goes_by_band_then_tenant_then_warm_first():
    q = FairQueue()
    for key, tier, tenant, prio in (("a1", "cold", "a", 0), ("a2", "warm", "a", 0), ("b1", "cold", "b", 0),
                                    ("low", "warm", "c", 5), ("urgent", "cold", "c", -1)):
        q.push(Waiter(key, tier, tenant, prio, 100.0))
    assert len(q) == 5 and q.by_tier == {"cold": 3, "warm": 2}
    order = [q.pop().key for _ in range(5)]
    # band -1 first; then band 0: a and b at 0 -> a (name), a's warm first; b (100 < a's 200); a; band 5
    assert order == ["urgent", "a2", "b1", "a1", "low"] and q.pop() is None and q.bands == {}
    assert q.vtc.counters == {"c": 200.0, "a": 200.0, "b": 100.0}


def test_a_flooding_tenant_does_not_push_another_back_beyond_one_request():
    """Tenant a has 20 waiting, b sends one: b's goes out after at most one of a's (VTC's bound)."""
    q = FairQueue()
    for i in range(20):
        q.push(Waiter(f"a{i}", "cold", "a", 0, 100.0))
    q.pop()                                   # a served once: a 100
    q.push(Waiter("b0", "cold", "b", 0, 100.0))   # b lifted to 100 (a's)
    assert [q.pop().key for _ in range(2)] == ["a1", "b0"]    # a1 on the tie by name, then b
    assert q.cancel("a5") and not q.cancel("a5") and len(q) == 17


def test_tokens_per_second_limit_refuses_with_the_wait():
    b = TokenBucket(100.0)
    assert b.take(80, now=0.0) == 0.0          # starts full (one second's worth)
    assert b.take(50, now=0.1) == pytest.approx(0.2)   # 30 left: 20 more come in 0.2 s
    assert b.take(50, now=0.3) == 0.0          # 30 + 20 = 50
    assert b.take(500, now=10.0) == 0.0         # a request larger than a second's worth: one bucket of it


def test_admission_limits_a_tenant_and_orders_by_priority():
    a = Admission(AdmissionConfig(max_in_flight=1), TenantConfig(limits={"a": TenantLimit(tokens_per_s=100)}))
    assert a.offer("x", "cold", "a", tokens=100, now=0.0) == "run"
    assert a.offer("y", "cold", "a", tokens=100, now=0.5) == "limited" and a.retry_after_s == pytest.approx(0.5)
    assert a.offer("x2", "cold", "a", tokens=0, now=0.5) == "queued"      # a at the limit: waits
    assert a.offer("lo", "warm", "a", priority=3, now=0.5) == "queued"
    assert a.offer("hi", "cold", "a", priority=-2, now=0.5) == "queued"
    assert [a.release("a") for _ in range(3)] == ["hi", "x2", "lo"] and a.limited == 1


def test_a_tenant_under_its_share_starts_at_once_even_past_the_limit():
    """The flood holds every slot; a light tenant with nothing waiting and under its share
    (limit / active tenants) is not made to wait for the flood's requests to end."""
    a = Admission(AdmissionConfig(max_in_flight=4))
    assert [a.offer(f"h{i}", "cold", "heavy") for i in range(6)] == ["run"] * 4 + ["queued"] * 2
    assert a.fair_share("light") == 2.0                           # 4 / (heavy, light)
    assert [a.offer(f"l{i}", "cold", "light") for i in range(3)] == ["run", "run", "queued"]   # 2 = its share
    assert a.in_flight == 6 and a.tenant_in_flight == {"heavy": 4, "light": 2}
    # back under the limit, VTC's turn: l2 was lifted to heavy's counter (4) when it queued: a tie, by name
    assert [a.release("heavy") for _ in range(4)] == [None, None, "h4", "l2"]


def test_identity_and_priority_parsing():
    assert split_keys(["k1=alice", "k2"]) == (("k1", "k2"), {"k1": "alice", "k2": "default"})
    assert priority_of(None, None) == 0 and priority_of(None, "-3") == -3 and priority_of(2, "-3") == 2
    with pytest.raises(ValueError, match="X-Priority must be an integer"):
        priority_of(None, "high")
    with pytest.raises(ValueError, match="priority must be in"):
        priority_of(1 << 20, None)
    assert TenantLimit.parse("alice:in_flight=4,tokens_s=2000") == ("alice", TenantLimit(4, 2000.0))
    with pytest.raises(ValueError, match="unknown limit 'rps'"):
        TenantLimit.parse("alice:rps=3")
    with pytest.raises(ValueError, match="tokens_s must be > 0"):
        TenantLimit.parse("*:tokens_s=0")


def test_a_tenant_at_its_in_flight_limit_is_refused_until_one_of_its_requests_ends():
    a = Admission(AdmissionConfig(max_in_flight=10), TenantConfig(limits={"*": TenantLimit(max_in_flight=2)}))
    assert [a.offer(i, "warm", "a") for i in range(3)] == ["run", "run", "limited"]
    assert a.offer("b0", "warm", "b") == "run" and a.retry_after_s == 1.0      # another tenant: its own count
    assert a.release("a") is None and a.offer("a3", "warm", "a") == "run"
    assert a.tenant_in_flight == {"a": 2, "b": 1} and a.limited == 1


def test_the_worker_priority_carries_the_band_and_a_backlogged_tenants_place_behind():
    a = Admission(AdmissionConfig(max_in_flight=2))
    assert [a.offer(k, "cold", "heavy") for k in ("h0", "h1", "h2")] == ["run", "run", "queued"]
    assert a.worker_priority("heavy", 0) == 0                    # alone: as before tenants
    assert a.offer("l0", "cold", "light", priority=-1) == "run"  # under its share: at once
    assert (a.worker_priority("heavy", 0), a.worker_priority("light", -1)) == (1, -2)   # heavy waits beside light
    assert a.worker_priority("heavy", 2) == 5

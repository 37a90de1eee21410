"""The admission limit sized to the fleet (routing/admission.py): hand-worked numbers."""

import pytest

from warmpath.routing.admission import Admission, AdmissionConfig, fleet_limit, worker_slots
from warmpath.routing.views import WorkerView


def w(wid, role="decode", seqs=64, kv=None):
    return WorkerView(wid, role, max_seqs=seqs, kv_tokens=kv)


def test_worker_slots_sequence_limit_or_kv_room():
    assert worker_slots(w("a", seqs=64, kv=8192), None) == 64          # no request size seen yet
    assert worker_slots(w("a", seqs=64, kv=8192), 3000.0) == 2         # 8192 // 3000
    assert worker_slots(w("a", seqs=4, kv=1 << 20), 3000.0) == 4       # the scheduler's limit binds
    assert worker_slots(w("a", seqs=64, kv=1000), 3000.0) == 1         # never below one
    assert worker_slots(WorkerView("a", "decode"), 3000.0) == 64       # said nothing: the engine default


def test_fleet_limit_sums_every_role_and_says_why():
    f = fleet_limit([w("p", "prefill", 64, 16384), w("d0", "decode", 64, 8192), w("d1", "decode", 8, None)], 4096.0)
    assert f.slots == {"p": 4, "d0": 2, "d1": 8} and f.limit == 14 and f.source == "fleet"
    assert f.reason == ("sum of what each worker can hold (sequence limit, KV room at 4096 tokens per "
                        "request): d0 2, d1 8, p 4")
    assert fleet_limit([], 4096.0).limit == 1


def test_fit_follows_the_fleet_and_scales_the_queues():
    a = Admission()
    assert a.fit([w("d0", seqs=3), w("d1", seqs=2)]) == [] and a.limit == 5
    assert (a.queue_limit("cold"), a.queue_limit("warm")) == (32, 64)   # the floors
    a.fit([w(f"d{i}", seqs=10) for i in range(3)])
    assert a.limit == 30 and (a.queue_limit("cold"), a.queue_limit("warm")) == (40, 80)   # 4/3, 8/3


def test_growing_limit_releases_waiters_warm_first_and_shrinking_holds_them():
    a = Admission()
    a.fit([w("d0", seqs=1)])
    assert [a.offer(k, c) for k, c in (("c0", "cold"), ("c1", "cold"), ("w1", "warm"))] == ["run", "queued", "queued"]
    assert a.fit([w("d0", seqs=1), w("d1", seqs=2)]) == ["w1", "c1"] and a.in_flight == 3
    a.fit([w("d0", seqs=1)])                     # d1 left: the limit drops to 1
    assert a.offer("c2", "cold") == "queued"
    assert a.release() is None and a.release() is None and a.in_flight == 1   # still over
    assert a.release() == "c2" and a.in_flight == 1 and a.peak_waiting == 2


def test_request_size_refits_only_when_it_moves():
    a = Admission()
    a.fit([w("d0", seqs=64, kv=8192)])
    assert a.limit == 64 and a.observe(4000) is True       # the first size seen
    a.fit([w("d0", seqs=64, kv=8192)])
    assert a.limit == 2 and a.current.request_tokens == 4000.0
    assert a.observe(4020) is False                         # mean 4010: within 1%
    assert a.observe(5000) is True                          # mean 4340
    fixed = Admission(AdmissionConfig(max_in_flight=7))
    assert fixed.observe(4000) is False and fixed.fit([w("d0", seqs=64)]) == [] and fixed.limit == 7
    assert fixed.to_json()["reason"] == "fixed by --max-in-flight 7"


def test_flags_round_trip():
    assert AdmissionConfig.from_flags(None, None, None) == AdmissionConfig()
    c = AdmissionConfig.from_flags(12, None, 5)
    assert c.to_argv() == ["--max-in-flight", "12", "--warm-queue", "5"]
    a = Admission(c)
    assert (a.limit, a.queue_limit("warm"), a.queue_limit("cold")) == (12, 5, 32)
    with pytest.raises(ValueError, match="max_in_flight"):
        AdmissionConfig(max_in_flight=0)

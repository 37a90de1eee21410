"""Elastic tiers: a role change needs sustained pressure (hysteresis), keeps a worker in
each tier, and waits out a cooldown (no flapping)."""

from warmpath.router.elastic import Elastic, ElasticConfig
from warmpath.router.views import WorkerView


def views(cold_q, warm_q):
    """Two cold-tier and two warm-tier workers; queues in seconds = queued tokens / 100."""
    return ([WorkerView(f"c{i}", "pre-prefill", queued_prefill_tokens=q) for i, q in enumerate(cold_q)]
            + [WorkerView(f"w{i}", "prefill", queued_prefill_tokens=q) for i, q in enumerate(warm_q)])


def q(w):
    return w.queued_prefill_tokens / 100


def test_a_role_changes_only_after_pressure_holds():
    e = Elastic(ElasticConfig(ratio=2.0, min_queue_s=1.0, hold_s=5.0, cooldown_s=20.0))
    cold_busy = views([400, 400], [50, 0])          # cold tier 4 s each, warm 0.25 s mean
    assert e.step(cold_busy, q, 0.0) is None          # pressure starts
    assert e.step(cold_busy, q, 4.9) is None          # not held long enough
    ch = e.step(cold_busy, q, 5.0)
    assert (ch.worker, ch.old, ch.new) == ("w1", "prefill", "pre-prefill")   # the idler warm worker
    assert ch.reason == "cold tier queue 4.00s vs 0.25s for 5s" and e.changes == [ch]


def test_a_break_in_the_pressure_restarts_the_clock():
    e = Elastic(ElasticConfig(hold_s=5.0, cooldown_s=0.0))
    busy, calm = views([400, 400], [0, 0]), views([150, 0], [0, 0])   # calm: 0.75 s < min 1 s
    assert e.step(busy, q, 0.0) is None
    assert e.step(calm, q, 3.0) is None
    assert e.step(busy, q, 4.0) is None and e.step(busy, q, 8.9) is None
    assert e.step(busy, q, 9.0).new == "pre-prefill"


def test_cooldown_and_one_worker_kept_in_each_tier():
    e = Elastic(ElasticConfig(hold_s=0.0, cooldown_s=20.0))
    assert e.step(views([0, 0], [400, 400]), q, 0.0).new == "prefill"     # warm pressed: c0 moves
    assert e.step(views([0], [400, 400, 400]), q, 10.0) is None            # cooldown
    assert e.step(views([0], [400, 400, 400]), q, 30.0) is None            # last cold worker stays
    assert Elastic(ElasticConfig(enabled=False)).step(views([0, 0], [400, 400]), q, 0.0) is None

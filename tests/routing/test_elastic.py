"""Elastic roles: a role change needs sustained pressure (hysteresis), keeps a worker in each
role the fleet started with, waits out a cooldown and the last change's drain (no flapping);
the CPD tiers as before, and decode / replica by KV, TPOT and the share routed local."""

from dataclasses import replace

import pytest

from warmpath.slo import Target
from warmpath.routing.elastic import (
    ROLES,
    TIERS,
    Elastic,
    ElasticConfig,
    Load,
    RoleChange,
    held,
    pressure,
    slots_used,
)
from warmpath.routing.goodput import GoodputConfig
from warmpath.routing.policy import CPDPolicy, GoodputPolicy, PDPolicy, ReplicaPolicy
from warmpath.routing.route import RouteDecider
from warmpath.routing.views import PrefixHit, RequestView, WorkerView


def views(cold_q, warm_q):
    """Two cold-tier and two warm-tier workers; queues in seconds = queued tokens / 100."""
    return ([WorkerView(f"c{i}", "pre-prefill", queued_prefill_tokens=q) for i, q in enumerate(cold_q)]
            + [WorkerView(f"w{i}", "prefill", queued_prefill_tokens=q) for i, q in enumerate(warm_q)])


def q(w):
    return w.queued_prefill_tokens / 100


Q = Load(q)


def test_a_role_changes_only_after_pressure_holds():
    e = Elastic(ElasticConfig(ratio=2.0, min_pressure=1.0, hold_s=5.0, cooldown_s=20.0))
    cold_busy = views([400, 400], [50, 0])          # cold tier 4 s each, warm 0.25 s mean
    assert e.step(cold_busy, Q, 0.0) is None          # pressure starts
    assert e.step(cold_busy, Q, 4.9) is None          # not held long enough
    ch = e.step(cold_busy, Q, 5.0)
    assert (ch.worker, ch.old, ch.new) == ("w1", "prefill", "pre-prefill")   # the idler warm worker
    assert ch.reason == "pre-prefill pressure 4.00 vs prefill 0.25 for 5s; local share 0.00" and e.changes == [ch]


def test_a_break_in_the_pressure_restarts_the_clock():
    e = Elastic(ElasticConfig(hold_s=5.0, cooldown_s=0.0))
    busy, calm = views([400, 400], [0, 0]), views([150, 0], [0, 0])   # calm: 0.75 < min 1
    assert e.step(busy, Q, 0.0) is None
    assert e.step(calm, Q, 3.0) is None
    assert e.step(busy, Q, 4.0) is None and e.step(busy, Q, 8.9) is None
    assert e.step(busy, Q, 9.0).new == "pre-prefill"


def test_cooldown_and_one_worker_kept_in_each_tier():
    e = Elastic(ElasticConfig(hold_s=0.0, cooldown_s=20.0))
    assert e.step(views([0, 0], [400, 400]), Q, 0.0).new == "prefill"     # warm pressed: c0 moves
    assert e.step(views([0], [400, 400, 400]), Q, 10.0) is None            # cooldown
    assert e.step(views([0], [400, 400, 400]), Q, 30.0) is None            # last cold worker stays
    assert Elastic(ElasticConfig(enabled=False)).step(views([0, 0], [400, 400]), Q, 0.0) is None


def fleet(kv=0.0, running=0, dq=0):
    """Goodput-like fleet: p0, p1 (prefill, idle) and d0 (decode with ``kv`` use, ``running``
    requests, ``dq`` queued prompt tokens)."""
    return [WorkerView("p0", "prefill"), WorkerView("p1", "prefill"),
            WorkerView("d0", "decode", queued_prefill_tokens=dq, running=running, kv_usage=kv)]


ALL = ElasticConfig(roles=ROLES, hold_s=0.0, cooldown_s=0.0)


def test_pressure_per_role_in_units_of_its_budget():
    cfg = ElasticConfig(roles=ROLES, cold_queue_s=20.0, warm_queue_s=2.0, kv_high=0.8, tpot_s=0.05)
    load = Load(q, tpot_s=lambda w: 0.1)
    assert pressure(cfg, WorkerView("c", "pre-prefill", queued_prefill_tokens=500), load) == 0.25   # 5 s / 20 s
    assert pressure(cfg, WorkerView("w", "prefill", queued_prefill_tokens=500), load) == 2.5        # 5 s / 2 s
    assert pressure(cfg, WorkerView("d", "decode", kv_usage=0.4), load) == 2.0      # TPOT 0.1 / 0.05 over KV 0.5
    assert pressure(cfg, WorkerView("d", "decode", kv_usage=0.4), Load(q)) == 0.5   # KV 0.4 / 0.8
    assert pressure(cfg, WorkerView("r", "replica", queued_prefill_tokens=600), Load(q)) == 3.0   # its queue
    assert pressure(ElasticConfig(), WorkerView("d", "decode", kv_usage=0.45), load) == 0.5   # no TPOT unit


def test_a_pressed_decode_side_takes_a_prefill_worker_as_decode_or_as_replica_by_the_local_share():
    # d0 at 99% KV: pressure 1.1 > 1 and > 2 x prefill's 0; prefill keeps one of its two
    ch = Elastic(ALL).step(fleet(kv=0.99), Load(q, local_share=0.2), 0.0)
    assert (ch.worker, ch.old, ch.new) == ("p0", "prefill", "decode")
    assert ch.reason == "decode pressure 1.10 vs prefill 0.00 for 0s; local share 0.20"
    ch = Elastic(ALL).step(fleet(kv=0.99), Load(q, local_share=0.5), 0.0)   # half the requests go local
    assert (ch.worker, ch.new) == ("p0", "replica")
    # without replica among the roles (the cpd policy's): decode, whatever the share
    cpd = ElasticConfig(roles=CPDPolicy.roles, hold_s=0.0, cooldown_s=0.0)
    assert Elastic(cpd).step(fleet(kv=0.99), Load(q, local_share=0.9), 0.0).new == "decode"
    assert Elastic(ALL).step(fleet(kv=0.89), Load(q, local_share=0.9), 0.0) is None   # 0.99 < 1: not pressed


def test_the_last_worker_of_a_role_the_fleet_started_with_stays():
    # the prefill tier swamped (5 s each) and d0 idle: d0 is decode's only worker -> nothing moves
    busy = [WorkerView("p0", "prefill", queued_prefill_tokens=500), WorkerView("d0", "decode")]
    assert Elastic(ALL).step(busy, Q, 0.0) is None


def test_a_replica_moves_back_once_its_decodes_drained_and_another_role_is_pressed():
    e = Elastic(ALL)
    assert e.step(fleet(kv=0.99), Load(q, local_share=0.8), 0.0).new == "replica"   # p0 -> replica
    # now the prefill tier is swamped (p1 at 4 s) and the replica p0 idle: the replica is no
    # role the fleet started with, so its one worker may go
    swamped = [WorkerView("p0", "replica"), WorkerView("p1", "prefill", queued_prefill_tokens=400),
               WorkerView("d0", "decode", kv_usage=0.45)]
    ch = e.step(swamped, Q, 1.0)
    assert (ch.worker, ch.old, ch.new) == ("p0", "replica", "prefill")
    assert ch.reason == "prefill pressure 4.00 vs replica 0.00 for 0s; local share 0.00"
    # p0 still decodes 2 requests of its replica days: no other change until they are done
    moved = [WorkerView("p0", "prefill"), WorkerView("p1", "prefill", queued_prefill_tokens=800),
             WorkerView("d0", "decode", kv_usage=0.0)]
    assert held(ch, moved[0], Load(q, decoding=lambda w: 2)) == 2
    assert e.step(moved, Load(q, decoding=lambda w: 2 if w.worker_id == "p0" else 0), 2.0) is None
    assert e.draining == ch
    assert e.step(moved, Load(q, decoding=lambda w: 0), 3.0) is None   # drained; d0, decode's last, stays
    assert e.draining is None and [(t, c.new) for t, c in e.drained] == [(1.0, "replica"), (3.0, "prefill")]


def test_at_equal_pressure_a_lent_worker_goes_back_first_under_roles():
    e = Elastic(ElasticConfig(roles=ROLES, hold_s=0.0, cooldown_s=0.0, lent_first=True))
    assert e.step(fleet(kv=0.99), Q, 0.0).new == "decode"                  # p0 lent to decode
    busy = [WorkerView("p0", "decode"), WorkerView("p1", "prefill", queued_prefill_tokens=400),
            WorkerView("d0", "decode")]
    assert e.step(busy, Q, 1.0).worker == "p0"          # both decode workers idle: the lent one returns
    plain = Elastic(ElasticConfig(roles=ROLES, hold_s=0.0, cooldown_s=0.0))   # as --elastic on: lowest id
    plain.step(fleet(kv=0.99), Q, 0.0)
    assert plain.step(busy, Q, 1.0).worker == "d0"
    assert ElasticConfig.from_mode("roles", "goodput").lent_first and not ElasticConfig.from_mode("on", "cpd").lent_first


def test_held_work_is_what_the_new_role_cannot_serve():
    dec, pre = WorkerView("x", "decode", queued_prefill_tokens=300), WorkerView("x", "prefill", queued_prefill_tokens=300)
    two = Load(q, decoding=lambda w: 2)
    assert held(RoleChange(0, "x", "decode", "prefill", ""), pre, two) == 2        # decodes finish
    assert held(RoleChange(0, "x", "prefill", "decode", ""), dec, two) == 300      # queued prompts finish
    assert held(RoleChange(0, "x", "prefill", "replica", ""), dec, two) == 0       # a replica does both
    assert held(RoleChange(0, "x", "decode", "replica", ""), dec, two) == 0
    assert held(RoleChange(0, "x", "prefill", "pre-prefill", ""), pre, two) == 0   # the CPD tiers: nothing


def test_a_drain_past_drain_s_counts_as_done():
    e = Elastic(ElasticConfig(roles=ROLES, hold_s=0.0, cooldown_s=0.0, drain_s=10.0))
    e.draining = RoleChange(0.0, "p0", "decode", "prefill", "")
    stuck = [WorkerView("p0", "prefill"), WorkerView("d0", "decode")]
    load = Load(q, decoding=lambda w: 1)
    assert e.step(stuck, load, 9.9) is None and e.draining is not None
    e.step(stuck, load, 10.0)
    assert e.draining is None and e.drained[-1][0] == 10.0


def test_modes():
    assert ElasticConfig.from_mode("on", "cpd").roles == TIERS
    assert ElasticConfig.from_mode("auto", "cpd").enabled and ElasticConfig.from_mode("auto", "cpd").roles == TIERS
    assert not ElasticConfig.from_mode("auto", "goodput").enabled and not ElasticConfig.from_mode("off", "cpd").enabled
    assert ElasticConfig.from_mode("roles", "cpd", CPDPolicy.roles).roles == ("pre-prefill", "prefill", "decode")
    assert ElasticConfig.from_mode("roles", "goodput", GoodputPolicy.roles).roles == ROLES
    assert not ElasticConfig.from_mode("roles", "replica", ("replica",)).enabled   # one role: nothing to move
    with pytest.raises(ValueError, match="--elastic must be one of"):
        ElasticConfig.from_mode("maybe", "cpd")
    with pytest.raises(ValueError, match="two or more"):
        ElasticConfig(roles=("decode",))


def test_the_decider_feeds_the_rule_its_policy_units_and_the_share_routed_local():
    target = Target.parse("warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.05")
    d = RouteDecider(GoodputPolicy(GoodputConfig(target)), elastic=ElasticConfig(roles=ROLES, hold_s=0, cooldown_s=0))
    cfg = d.elastic.cfg
    assert (cfg.cold_queue_s, cfg.warm_queue_s, cfg.tpot_s) == (20.0, 2.0, 0.05)
    assert RouteDecider(CPDPolicy(), elastic=ElasticConfig()).elastic.cfg.tpot_s is None   # no target: KV only
    tiers = RouteDecider(GoodputPolicy(GoodputConfig(target)), elastic=ElasticConfig()).elastic.cfg   # --elastic on
    assert (tiers.cold_queue_s, tiers.warm_queue_s) == (None, None)   # 1 s units, as the CPD tiers always had
    for local in (True, True, True, False):   # 3 of the last 4 decisions were local
        d.recent_local.append(local)
    ch = d.rebalance(fleet(kv=0.99), 0.0)     # KV 1.1 units; TPOT 0 (nothing running)
    assert (ch.worker, ch.new) == ("p0", "replica") and ch.reason.endswith("local share 0.75")


def test_a_decode_type_worker_counts_its_slots_in_use_with_its_share_of_the_waiting():
    views = [WorkerView("c0", "pre-prefill"), WorkerView("d0", "decode", running=3), WorkerView("r0", "replica", running=1)]
    used = slots_used(lambda w: w.running, views, 4, {"d0": 4, "r0": 4, "c0": 8})   # 4 waiting: 2 each
    assert (used(views[1]), used(views[2])) == (1.25, 0.75)      # (3 + 2) / 4, (1 + 2) / 4
    assert slots_used(lambda w: w.running, views, 4, {})(views[1]) == 0.0   # slots unknown
    assert pressure(ALL, views[1], Load(q, slots_used=used)) == 1.25
    # the decider takes the admission's waiting and slots: a 1C + 1R pair with 4 waiting lends
    # its cold worker (no queue) to the replica side under spare_last
    d = RouteDecider(GoodputPolicy(), elastic=SPARE)
    pair_ = [WorkerView("c0", "pre-prefill"), WorkerView("r0", "replica", running=4)]
    assert d.rebalance(pair_, 0.0, waiting=0, slots={"r0": 4, "c0": 8}) is None          # full, none waiting: 1.0
    ch = d.rebalance(pair_, 1.0, waiting=2, slots={"r0": 4, "c0": 8})                     # (4 + 2) / 4 = 1.5
    assert (ch.worker, ch.old, ch.new) == ("c0", "pre-prefill", "replica")
    assert ch.reason.startswith("replica pressure 1.50 vs pre-prefill 0.00")


def test_a_decision_counts_as_local_when_one_worker_does_both():
    rv = RequestView(32, (), 16, max_tokens=128)
    for policy, workers, local in ((ReplicaPolicy(), [WorkerView("r0", "replica")], True),
                                   (PDPolicy(), [WorkerView("p0", "prefill"), WorkerView("d0", "decode")], False)):
        d = RouteDecider(policy)
        snap = d.snapshot(workers, lambda w: PrefixHit(), None, 46080)
        d.decide_route(rv, snap)
        d.decide_route(rv, snap, arrival=False)      # a second decision for one request (or /ready): not counted
        assert list(d.recent_local) == [local]


SPARE = ElasticConfig(roles=ROLES, hold_s=0.0, cooldown_s=0.0, spare_last=True)


def pair(p_role="prefill", kv=0.0, p_kv=0.0):
    """A 1P1D pair: p0 (``p_role``, KV ``p_kv``) and d0 (decode, KV ``kv``)."""
    return [WorkerView("p0", p_role, kv_usage=p_kv), WorkerView("d0", "decode", kv_usage=kv)]


def test_spare_last_lends_a_pairs_only_prefill_worker_as_a_replica_and_repays_it_when_all_is_calm():
    assert Elastic(ALL).step(pair(kv=0.99), Load(q, local_share=0.6), 0.0) is None   # each started role keeps one
    e = Elastic(SPARE)
    ch = e.step(pair(kv=0.99), Load(q, local_share=0.6), 0.0)      # decode 1.10 vs prefill 0: p0 lent
    assert (ch.worker, ch.old, ch.new) == ("p0", "prefill", "replica")
    # pressed no more, but d0 at KV 0.54 (0.60 > 0.5): not calm, nothing moves
    assert e.step(pair("replica", kv=0.54), Q, 1.0) is None
    # 0.40 and 0.40 are calm, but without p0 the two decode-type workers' load falls on one: 0.80
    assert e.step(pair("replica", kv=0.36, p_kv=0.36), Q, 2.0) is None
    ch = e.step(pair("replica", kv=0.2, p_kv=0.18), Q, 3.0)        # 0.22 and 0.20, without p0 0.44 / 0.40
    assert (ch.worker, ch.old, ch.new) == ("p0", "replica", "prefill")
    assert ch.reason == "repaid to prefill (its last worker): every role's pressure <= 0.50 without it for 0s"


def test_a_repayment_waits_for_calm_held_and_a_pressure_in_between_restarts_the_clock():
    e = Elastic(replace(SPARE, hold_s=5.0))
    for t in (0.0, 5.0):                                            # decode pressed, held 5 s: p0 lent
        ch = e.step(pair(kv=0.99), Load(q, local_share=0.6), t)
    assert ch.new == "replica"
    assert e.step(pair("replica"), Q, 6.0) is None                  # calm from 6
    assert e.step(pair("replica", kv=0.99), Q, 8.0) is None         # decode pressed again (no donor): clock reset
    assert e.step(pair("replica"), Q, 9.0) is None and e.step(pair("replica"), Q, 13.9) is None
    assert e.step(pair("replica"), Q, 14.0).new == "prefill"


def test_spare_last_never_leaves_the_fleet_without_a_worker_that_decodes():
    # the prefill tier swamped (5 s) and d0 idle: d0 is the only worker that decodes -> it stays
    busy = [WorkerView("p0", "prefill", queued_prefill_tokens=500), WorkerView("d0", "decode")]
    assert Elastic(SPARE).step(busy, Q, 0.0) is None
    # with a replica beside it, the decode worker's last may go to the prefill tier
    busy.append(WorkerView("r0", "replica", kv_usage=0.45))
    assert Elastic(SPARE).step(busy, Q, 0.0).worker == "d0"


def test_only_a_policy_computing_prompts_anywhere_under_roles_spares_a_last_worker():
    assert GoodputPolicy().computes_anywhere and not GoodputPolicy(GoodputConfig(local=False)).computes_anywhere
    assert not ReplicaPolicy().computes_anywhere and not CPDPolicy().computes_anywhere
    assert ElasticConfig.from_mode("roles", "goodput", GoodputPolicy.roles, True).spare_last
    assert not ElasticConfig.from_mode("roles", "goodput", GoodputPolicy.roles, False).spare_last
    assert not ElasticConfig.from_mode("on", "cpd", CPDPolicy.roles, True).spare_last

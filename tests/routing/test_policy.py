import pytest

from warmpath.routing.estimate import estimate
from warmpath.routing.policy import CPDConfig, CPDPolicy, PDKVPolicy, PDPolicy, ReplicaPolicy
from warmpath.routing.views import PrefixHit, RequestView, Snapshot, WorkerView

REQ = RequestView(num_tokens=1600, block_hashes=tuple(bytes([i]) * 16 for i in range(100)), block_size=16,
                  max_tokens=128)


def w(wid, role, q=0, running=0, **kw):
    return WorkerView(wid, role, queued_prefill_tokens=q, running=running, prefill_tok_s=500.0, **kw)


def snap(workers, hits=None, session=None):
    return Snapshot(workers, hits or {}, session, kv_bytes_per_token=1000, network_bytes_s=1e9)


def test_estimate_components_by_hand():
    s = snap([w("p", "prefill", q=500)], {"p": PrefixHit(50, 30)})
    e = estimate(s.workers[0], REQ, s)
    assert e.queue_s == 1.0                        # 500 queued tokens at 500 tok/s
    assert e.cached_tokens == 1280                 # 800 local + 480 from L3 (load beats recompute)
    # 320 new tokens after 1280 of context: 320 · (1 + (1280 + 160) / 8192) work units at 500/s
    assert e.compute_s == pytest.approx(320 * (1 + 1440 / 8192) / 500) == pytest.approx(0.7525)
    # L2 at the heartbeat's 4 GB/s; L3 by the prior line: 2 ms + bytes / 0.4 GB/s
    assert e.load_s == pytest.approx(800 * 1000 / 4e9 + 2e-3 + 480 * 1000 / 4e8)
    # write-through of the 20 blocks (320 tokens) the store lacks, before the reply
    assert e.handoff_s == pytest.approx(2e-3 + 320 * 1000 / 4e8)
    assert e.ttft_s == pytest.approx(e.queue_s + e.load_s + e.compute_s + e.handoff_s)   # no hop without a model


def test_l3_recompute_when_cheaper():
    slow = snap([w("p", "prefill", l3_bytes_s=1e3)], {"p": PrefixHit(0, 10)})
    assert estimate(slow.workers[0], REQ, slow).cached_tokens == 0


def test_cpd_cold_goes_to_pre_prefill_warm_to_prefill():
    ws = [w("c1", "pre-prefill"), w("c2", "pre-prefill", q=100), w("p1", "prefill", q=800),
          w("p2", "prefill"), w("d1", "decode", running=3), w("d2", "decode", running=1)]
    cold = CPDPolicy().route(REQ, snap(ws))
    assert (cold.prefill, cold.decode, cold.path) == ("c1", "d2", "cold")
    warm = CPDPolicy().route(REQ, snap(ws, {"p1": PrefixHit(90, 0), "p2": PrefixHit(10, 0)}))
    # p1 has the prefix but 800 queued tokens; p2 must compute 1440 tokens: p1 wins
    assert (warm.prefill, warm.path, warm.cached_tokens) == ("p1", "warm", 1440)


def test_cpd_threshold_and_min_cached():
    ws = [w("c", "pre-prefill"), w("p", "prefill"), w("d", "decode")]
    hits = {"p": PrefixHit(40, 0)}                  # 640 / 1600 = 0.4 reuse
    assert CPDPolicy(CPDConfig(cold_threshold=0.5)).route(REQ, snap(ws, hits)).path == "cold"
    assert CPDPolicy(CPDConfig(cold_threshold=0.3)).route(REQ, snap(ws, hits)).path == "warm"
    assert CPDPolicy(CPDConfig(cold_threshold=0.3, min_cached_tokens=1000)).route(
        REQ, snap(ws, hits)).path == "cold"


def test_cpd_cold_spills_to_an_idle_warm_worker_unless_it_harms_warm_traffic():
    ws = [w("c", "pre-prefill", q=10000), w("p", "prefill"), w("d", "decode")]
    # c: 20 s of queue + 3.5125 s of compute (1600 · (1 + 800/8192) work at 500/s) + 6 ms of
    # write-through = 23.5185 s; p: the same without the queue = 3.5185 s, and no warm
    # request is arriving that it would delay: spill
    d = CPDPolicy().route(REQ, snap(ws))
    assert (d.prefill, d.path, d.est_ttft_s) == ("p", "cold", pytest.approx(3.5185))
    assert d.reason.endswith("harm 0.000s (spill)")
    # 0.2 warm requests/s at p would each wait 3.5125/2 s on average: 0.2 · 3.5125² / 2 =
    # 1.234 s of warm delay, which weighs 20 / 2 = 10 times a cold request's own: 12.34 s,
    # and 3.5185 + 12.34 < 23.5185: still a spill; at 0.6/s (37.0 s): the cold tier keeps it
    s = snap(ws)
    s.arrivals_s = {"warm": 0.2}
    assert CPDPolicy().route(REQ, s).reason.endswith("harm 12.338s (spill)")
    s.arrivals_s = {"warm": 0.6}
    d = CPDPolicy().route(REQ, s)
    assert d.prefill == "c" and "harm 0.000s" in d.reason and "spill" not in d.reason
    assert CPDPolicy(CPDConfig(harm_weight=0)).route(REQ, s).prefill == "p"
    # the harm counts the queue ahead too: behind 1 s of queue at p, 0.2/s arriving there wait
    # 3.5125 s more each: 0.2 · 3.5125 · (1 + 3.5125/2) · 10 = 19.36 s, and 4.5185 + 19.36 >
    # 23.5185: the cold tier keeps it
    ws2 = [w("c", "pre-prefill", q=10000), w("p", "prefill", q=500), w("d", "decode")]
    s2 = snap(ws2)
    s2.arrivals_s = {"warm": 0.2}
    assert CPDPolicy().route(REQ, s2).prefill == "c"
    s2.arrivals_s = {"warm": 0.15}    # 14.52 s: 19.04 < 23.5185, a spill again
    assert CPDPolicy().route(REQ, s2).reason.endswith("harm 14.522s (spill)")


def test_cpd_warm_spills_to_an_idle_cold_worker():
    ws = [w("c", "pre-prefill"), w("p", "prefill", q=10000), w("d", "decode")]
    # p holds 90 blocks locally but 20 s of queue; c loads them from L3 (2 ms + 1.44 MB at
    # 0.4 GB/s), computes 160 tokens after 1440 (160 · (1 + 1520/8192) at 500/s) and writes
    # 10 blocks through (2 ms + 0.16 MB at 0.4 GB/s)
    d = CPDPolicy().route(REQ, snap(ws, {"p": PrefixHit(90, 0), "c": PrefixHit(0, 90)}))
    assert (d.prefill, d.path, d.cached_tokens) == ("c", "warm", 1440) and d.reason.endswith("(spill)")
    assert d.est_ttft_s == pytest.approx(2e-3 + 1440e3 / 4e8 + 160 * (1 + 1520 / 8192) / 500 + 2e-3 + 160e3 / 4e8)


def test_pd_kv_cost_credits_cached_blocks_by_tier():
    ws = [w("a", "prefill", q=300), w("b", "prefill", q=0), w("d", "decode")]
    hits = {"a": PrefixHit(60, 0), "b": PrefixHit(0, 60)}
    pol = PDKVPolicy()
    # a: 300 queued + 1600 - 960 = 940; b: 0 + 1600 - 0.5 · 960 = 1120
    assert (pol.cost(ws[0], REQ, snap(ws, hits)), pol.cost(ws[1], REQ, snap(ws, hits))) == (940, 1120)
    d = pol.route(REQ, snap(ws, hits))
    assert (d.prefill, d.decode, d.path, d.reason) == ("a", "d", "pd", "kv-aware: cost 940 tokens")
    assert PDKVPolicy(l3_credit=1.0).route(REQ, snap(ws, hits)).prefill == "b"    # 640 < 940


def test_session_keeps_its_decode_worker():
    ws = [w("c", "pre-prefill"), w("d1", "decode", running=9), w("d2", "decode")]
    assert CPDPolicy().route(REQ, snap(ws, session="d1")).decode == "d1"
    with pytest.raises(LookupError):
        CPDPolicy().route(REQ, snap([w("d", "decode")]))


def test_pd_is_cache_blind_and_replica_is_prefix_aware():
    ws = [w("p1", "prefill", q=10), w("p2", "prefill", q=0), w("d", "decode")]
    assert PDPolicy().route(REQ, snap(ws, {"p1": PrefixHit(99, 0)})).prefill == "p2"
    rs = [w("r1", "replica", q=100), w("r2", "replica")]
    d = ReplicaPolicy().route(REQ, snap(rs, {"r1": PrefixHit(99, 0)}))
    assert (d.prefill, d.decode, d.path) == ("r1", "r1", "replica")
    assert ReplicaPolicy().route(REQ, snap(rs)).prefill == "r2"


def test_policies_import_no_torch():
    import subprocess
    import sys

    code = ("import sys, warmpath.routing.policy, warmpath.routing.ppd, warmpath.routing.index,"
            " warmpath.routing.admission, warmpath.routing.sessions; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_replica_near_ties_go_where_fewer_run():
    # r1 learnt 5% faster but decodes 2 sequences; r2 idle: within 10% → a tie → r2 (fewer running)
    rs = [WorkerView("r1", "replica", running=2, prefill_tok_s=525.0), WorkerView("r2", "replica", prefill_tok_s=500.0)]
    assert ReplicaPolicy().route(REQ, snap(rs)).prefill == "r2"
    assert ReplicaPolicy(near=0.0).route(REQ, snap(rs)).prefill == "r1"      # exact ties only: the faster
    # 20% faster is beyond the tolerance: r1 despite its decodes
    rs[0] = WorkerView("r1", "replica", running=2, prefill_tok_s=600.0)
    assert ReplicaPolicy().route(REQ, snap(rs)).prefill == "r1"
    # a held prefix is never a near tie: r1 holds 99 of 100 blocks
    rs[0] = WorkerView("r1", "replica", running=2, prefill_tok_s=500.0)
    assert ReplicaPolicy().route(REQ, snap(rs, {"r1": PrefixHit(99, 0)})).prefill == "r1"
    with pytest.raises(ValueError, match="near"):
        ReplicaPolicy(near=-1)

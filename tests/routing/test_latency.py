"""The router's online model (lines fitted to the workers' replies) and the PPD switch's
correction from observed outcomes."""

import pytest

from warmpath.routing import ppd
from warmpath.routing.latency import ArrivalRates, PrefillObservation, RouterModel, work
from warmpath.routing.views import RequestView, WorkerView

W = WorkerView("p", "prefill", prefill_tok_s=400.0, l3_bytes_s=1e8)


def obs(prompt, cached=0, l3=0, queue=0.0, worker=1.0, get=0.0, put=0.0, put_bytes=0, trip=None):
    return PrefillObservation("p", prompt, cached, l3, queue, worker, get, put, put_bytes,
                              worker + 0.01 if trip is None else trip)


def test_priors_until_two_sizes_then_the_fitted_line():
    m = RouterModel(kv_bytes_per_token=1000)
    assert m.of(W).compute.bytes_s == 400.0 and m.of(W).compute_s(100, 0) == pytest.approx(work(100, 0) / 400)
    m.observe_prefill(obs(1000, queue=0.1, worker=2.1), W)      # compute 2.0 s of 1061.03 work units
    # one size: its speed (with the prior's zero overhead), not yet a line
    assert m.of(W).compute.bytes_s == pytest.approx(1061.03515625 / 2.0) and not m.of(W).compute.fitted
    # a worker never observed borrows its peers' lines, not its own heartbeat's 999 tok/s
    fresh = WorkerView("q", "prefill", prefill_tok_s=999.0)
    assert m.of(fresh).compute.bytes_s == pytest.approx(1061.03515625 / 2.0)
    m.observe_prefill(obs(2000, worker=4.0), W)                 # compute 4.0 s of 2244.14 units
    x1, x2 = work(1000, 0), work(2000, 0)
    assert (x1, x2) == (1000 * (1 + 500 / 8192), 2000 * (1 + 1000 / 8192))
    slope = (4.0 - 2.0) / (x2 - x1)
    got = m.of(W).compute
    assert got.bytes_s == pytest.approx(1 / slope) and got.overhead_s == pytest.approx(2.0 - slope * x1)
    assert m.params()["workers"]["p"]["observations"] == 2
    assert m.hop_s.value == pytest.approx(0.01)                 # round trip less the worker's time


def test_l3_lines_from_the_replies():
    m = RouterModel(kv_bytes_per_token=1000)
    # 1600 tokens read from L3 in 10 ms then 3200 in 18 ms: 1.6 MB per 8 ms = 200 MB/s, 2 ms overhead
    m.observe_prefill(obs(2000, cached=1600, l3=1600, worker=1.0, get=0.010), W)
    m.observe_prefill(obs(4000, cached=3200, l3=3200, worker=1.0, get=0.018), W)
    r = m.of(W).l3_read
    assert r.bytes_s == pytest.approx(2e8) and r.overhead_s == pytest.approx(0.002)
    m.observe_prefill(obs(100, put=0.5, put_bytes=10), W)     # one write size: prior kept
    assert m.of(W).l3_write.bytes_s == 1e8


def test_prediction_error_and_arrival_rates():
    m = RouterModel()
    assert m.observe_ttft(1.2, 1.0) == pytest.approx(0.2) and m.observe_ttft(0.5, 1.0) == pytest.approx(0.5)
    assert m.params()["ttft_error_p50"] == pytest.approx(0.35) and m.observe_ttft(1.0, 0.0) is None
    r = ArrivalRates(window_s=10.0)
    for t in (0.0, 1.0, 2.0, 9.0):
        r.note("cold", t)
    r.note("warm", 9.5)
    # 0.0 fell out of the window; one more than seen: (3 + 1) / 10 and (1 + 1) / 10
    assert r.rates(10.5) == {"cold": 0.4, "warm": 0.2}
    assert ArrivalRates(window_s=30.0).rates(0.0) == {"cold": 1 / 30, "warm": 1 / 30}


def test_ppd_explores_then_corrects_a_wrong_table_from_observed_outcomes():
    rv = RequestView(1000, (), 16, "s", turn=2, new_tokens=50, max_tokens=100)
    dw = WorkerView("d", "decode", running=1)
    key = ppd.bucket_of(1000, 50, 100, 1)
    table = ppd.PPDTable({key: ppd.Cell(0.1, 0.5, 0.02, 0.02)})     # says: local is 5x faster
    fb = ppd.PPDFeedback(min_samples=2, explore_every=4)
    cfg = ppd.PPDConfig("dynamic")
    first = ppd.decide(cfg, table, rv, dw, 0.0, fb)
    assert first.local and first.reason == f"explore local (bucket {key})" and first.bucket == key
    assert [ppd.decide(cfg, table, rv, dw, 0.0, fb).reason.split(" (")[1].startswith("dTTFT")
            for _ in range(3)] == [True] * 3                        # decisions 2-4: the table
    fb.observe(key, "local", 1.0, 0.05)
    fb.observe(key, "local", 1.0, 0.05)
    fifth = ppd.decide(cfg, table, rv, dw, 0.0, fb)                 # remote has no samples yet
    assert not fifth.local and fifth.reason.startswith("explore remote")
    fb.observe(key, "remote", 0.5, 0.02)
    fb.observe(key, "remote", 0.5, 0.02)
    d = ppd.decide(cfg, table, rv, dw, 0.0, fb)
    # observed: local 1.0 s vs remote 0.5 s (dTTFT -1.0) and TPOT +150%: remote
    assert not d.local and d.score == pytest.approx(-1.0 - 1.5) and "observed" in d.reason


def test_answer_timings_fit_the_decode_line_and_the_local_prefill_line():
    from warmpath.protocol.internal import AnswerTiming
    from warmpath.routing.predict import LineSteps, step_cost
    from warmpath.routing.views import Snapshot

    v = WorkerView("v0", "replica", prefill_tok_s=400.0)
    m = RouterModel()
    # a handoff's decode side: only its decode steps are learnt (0.5 s / 10 steps at batch 2)
    t1 = AnswerTiming(computed_tokens=1000, cached_tokens=0, prefill_s=2.1, queue_s=0.1, decode_s=0.5,
                      decode_steps=10, batch=2.0)
    m.observe_answer("v0", t1, v, computed_here=False)
    got = m.workers["v0"]
    assert got.observations == 0 and got.compute.bytes_s == 400.0
    assert got.decode.overhead_s == pytest.approx(0.05) and not got.decode.fitted   # one batch size: flat
    # it computed the prompt itself: the prefill line learns 2.0 s for 1000 uncached tokens after 0
    m.observe_answer("v0", t1, v, computed_here=True)
    assert got.observations == 1 and got.compute.bytes_s == pytest.approx(work(1000, 0) / 2.0)
    assert got.decode.overhead_s == pytest.approx(0.05)
    # batch 4 at 0.07 s a step: the line through (2, 0.05) and (4, 0.07)
    m.observe_answer("v0", AnswerTiming(computed_tokens=0, cached_tokens=500, prefill_s=0.2, decode_s=0.7,
                                        decode_steps=10, batch=4.0), v, computed_here=True)
    assert got.decode.fitted and 1 / got.decode.bytes_s == pytest.approx(0.01)
    assert got.decode.overhead_s == pytest.approx(0.03) and got.observations == 1   # nothing computed: no prefill
    assert m.hop_s.samples == 0                           # no round trip in an answer
    p = m.params()["workers"]["v0"]
    assert (p["decode_step_s"], p["decode_s_per_seq"], p["decode_samples"]) == (0.03, 0.01, 3)
    # the router's step cost for v0 now decodes on that line; a prefill chunk beside adds its work
    cost = step_cost(Snapshot([v], model=m), v)
    assert isinstance(cost, LineSteps) and cost.step_s([(1, 100)] * 3) == pytest.approx(0.06)
    assert cost.step_s([(1, 100)] * 3 + [(200, 0)]) == pytest.approx(0.06 + work(200, 0) / (work(1000, 0) / 2.0))
    # a calibration for the fleet does not replace a worker's own learnt steps
    m.steps[None] = LineSteps(0.0, 1.0)
    assert step_cost(Snapshot([v], model=m), v).step_s([(1, 100)] * 3) == pytest.approx(0.06)


def test_router_learns_from_an_answer_usage_and_ignores_malformed_timings():
    from warmpath.routing.policy import POLICIES
    from warmpath.routing.route import RouteDecider

    v = WorkerView("v0", "replica", prefill_tok_s=400.0)
    d = RouteDecider(POLICIES["replica"]())
    timing = {"computed_tokens": 800, "cached_tokens": 200, "prefill_s": 1.0, "decode_s": 0.4,
              "decode_steps": 8, "batch": 1.0, "future_field": 1}
    assert d.observe_answer("v0", {"warmpath": {"timing": timing}}, v, computed_here=True)
    w = d.model.workers["v0"]
    assert w.compute.bytes_s == pytest.approx(work(800, 200) / 1.0) and w.decode.overhead_s == pytest.approx(0.05)
    for bad in (None, {}, {"warmpath": {}}, {"warmpath": {"timing": {**timing, "batch": 0.5}}},
                {"warmpath": {"timing": "x"}}):
        assert not d.observe_answer("v0", bad, v, computed_here=True)
    assert not d.observe_answer("gone", {"warmpath": {"timing": timing}}, None, computed_here=True)
    assert w.observations == 1 and w.decode.samples == 1


def test_the_router_learns_a_decode_worker_s_own_l3_load_rate_from_its_answers():
    from warmpath.routing.policy import POLICIES
    from warmpath.routing.predict import handoff_load_s
    from warmpath.routing.route import RouteDecider
    from warmpath.routing.views import PrefixHit, RequestView, Snapshot

    d = RouteDecider(POLICIES["pd"]())
    d.model.kv_bytes_per_token = 1000
    v = WorkerView("d0", "decode")
    req = RequestView(1000, (), 16, "s", 1, max_tokens=32)     # 62 whole blocks: 992,000 bytes to load
    snap = Snapshot([v], {"d0": PrefixHit()}, kv_bytes_per_token=1000, model=d.model)
    assert handoff_load_s(v, req, snap) == pytest.approx(0.002 + 992_000 / 4e8)   # before any: the prior line
    own = {"loaded_tokens": {"L1": 0, "L2": 0, "L3": 2000}, "recomputed_tokens": 0, "l3_load_s": 0.5}
    assert d.observe_answer("d0", {"warmpath": {"decode": own}}, v, computed_here=False)
    assert d.model.l3_load_rate["d0"].bytes_s == pytest.approx(2_000_000 / 0.5)
    assert handoff_load_s(v, req, snap) == pytest.approx(992_000 / 4e6)         # 0.248 s at its own rate
    # a second answer, 1,000 tokens in 0.5 s: (0.9 x 2,000,000 + 1,000,000) / (0.9 x 0.5 + 0.5) bytes/s
    assert d.observe_answer("d0", {"warmpath": {"worker": {**own, "loaded_tokens": {"L3": 1000}}}}, v, computed_here=True)
    assert d.model.l3_load_rate["d0"].bytes_s == pytest.approx(2_800_000 / 0.95)
    # nothing loaded from L3, no seconds, or a malformed report: nothing learnt
    for bad in ({**own, "l3_load_s": 0.0}, {**own, "loaded_tokens": {"L1": 5}}, {**own, "l3_load_s": -1},
                {**own, "l3_load_s": "x"}, {"loaded_tokens": {"L3": 10}}):
        assert not d.observe_answer("d0", {"warmpath": {"decode": bad}}, v, computed_here=False)
    assert d.model.l3_load_rate["d0"].samples == 2 and "d1" not in d.model.l3_load_rate


def test_a_worker_with_few_observations_is_shrunk_towards_its_peers():
    m = RouterModel(kv_bytes_per_token=1000)
    a, b = WorkerView("a", "replica", prefill_tok_s=400.0), WorkerView("b", "replica", prefill_tok_s=400.0)
    for _ in range(40):                                   # a: 1000 tokens in 1.0 s, 40 times
        m.observe_prefill(PrefillObservation("a", 1000, 0, 0, 0.0, 1.0, 0, 0, 0, 1.01), a)
    ua = work(1000, 0)                                   # 1061.03515625 units / s on a
    assert m.of(a).compute.bytes_s == pytest.approx(ua)  # 40 >= 4 * SHRINK_N: its own line, as learnt
    m.observe_prefill(PrefillObservation("b", 1000, 0, 0, 0.0, 4.0, 0, 0, 0, 4.01), b)   # b: once, 4x slower
    # own weight 1 / (1 + 8): seconds per unit 1/9 * 4/ua + 8/9 * 1/ua = 12 / (9 ua)
    assert m.of(b).compute.bytes_s == pytest.approx(9 * ua / 12)
    assert m.workers["b"].compute.bytes_s == pytest.approx(ua / 4)   # what it learnt is kept as is
    for _ in range(31):                                  # 32 observations: its own line alone
        m.observe_prefill(PrefillObservation("b", 1000, 0, 0, 0.0, 4.0, 0, 0, 0, 4.01), b)
    assert m.of(b).compute.bytes_s == pytest.approx(ua / 4)

import asyncio

from warmpath.bench.sweep import max_rate_from_sweep, search_max_rate, tier_hit_ratios


def test_bisection_on_synthetic_latency_curve():
    # p90 TTFT = 0.2 / (1 - rate / 2.0): meets 1.0 s while rate <= 1.6
    calls = []

    async def ok(rate):
        calls.append(rate)
        return rate < 2.0 and 0.2 / (1 - rate / 2.0) <= 1.0

    best = asyncio.run(search_max_rate(ok, 0.5, 2.0, iters=6))
    assert 1.55 <= best <= 1.6
    assert len(calls) == 8
    assert asyncio.run(search_max_rate(ok, 1.9, 2.5)) is None


def test_max_rate_from_sweep_and_hit_ratios():
    runs = {0.4: {"slo_met": True}, 0.8: {"slo_met": True}, 1.2: {"slo_met": False}}
    assert max_rate_from_sweep(runs) == 0.8
    assert max_rate_from_sweep({1.0: {"slo_met": False}}) is None
    # sustained: a pass above a failing rate does not count
    assert max_rate_from_sweep({0.4: {"slo_met": True}, 0.8: {"slo_met": False}, 1.2: {"slo_met": True}}) == 0.4
    assert max_rate_from_sweep({1.2: {"slo_met": True}, 0.4: {"slo_met": False}}) is None
    before = {"warmpath_prefix_cache_query_tokens": 100, "warmpath_prefix_cache_hit_tokens": 10}
    after = {"warmpath_prefix_cache_query_tokens": 1100, "warmpath_prefix_cache_hit_tokens": 810,
             "warmpath_kv_tier_loaded_tokens_total:L2": 100, "warmpath_kv_tier_loaded_tokens_total:L3": 200}
    assert tier_hit_ratios(before, after) == {"L1": 0.5, "L2": 0.1, "L3": 0.2}
    assert tier_hit_ratios({}, {}) == {"L1": None, "L2": None, "L3": None}

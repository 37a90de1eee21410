"""Reading /metrics text: exact names (counters as ``*_total``), label subsets, per-tier totals."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from warmpath.bench.prom import sample_value, warmpath_totals


def exposition() -> str:
    r = CollectorRegistry()
    c = Counter("warmpath_kv_tier_loaded_tokens", "t", ["tier", "model"], registry=r)
    c.labels("L2", "m").inc(16)
    c.labels("L3", "m").inc(32)
    c.labels("L3", "n").inc(8)
    Gauge("warmpath_prefix_cache_query_tokens", "q", ["model"], registry=r).labels("m").set(100)
    h = Histogram("warmpath_router_queue_seconds", "h", ["cls"], buckets=(0.1, 1), registry=r)
    h.labels("warm").observe(0.05)
    h.labels("warm").observe(0.5)
    Gauge("other_metric", "o", registry=r).set(7)
    return generate_latest(r).decode()


def test_sample_value_matches_exact_name_and_label_subset():
    t = exposition()
    assert sample_value(t, "warmpath_kv_tier_loaded_tokens_total", tier="L3", model="n") == 8
    assert sample_value(t, "warmpath_kv_tier_loaded_tokens_total", tier="L3") == 32   # the first L3
    assert sample_value(t, "warmpath_kv_tier_loaded_tokens") is None   # counters are read as *_total
    assert sample_value(t, "warmpath_kv_tier_loaded_tokens_total", tier="L1") is None
    assert sample_value(t, "warmpath_router_queue_seconds_count", cls="warm") == 2
    assert sample_value(t, "warmpath_router_queue_seconds_bucket", cls="warm", le="0.1") == 1
    assert sample_value(t, "warmpath_router_queue_seconds_sum") == 0.55
    assert sample_value(t, "warmpath_prefix_cache_query_tokens") == 100
    assert sample_value(t, "warmpath_prefix") is None                  # no prefix matching


def test_warmpath_totals_sum_labels_but_keep_tiers_apart():
    got = warmpath_totals(exposition())
    assert got["warmpath_kv_tier_loaded_tokens_total:L2"] == 16
    assert got["warmpath_kv_tier_loaded_tokens_total:L3"] == 40
    assert got["warmpath_prefix_cache_query_tokens"] == 100
    assert got["warmpath_router_queue_seconds_count"] == 2
    assert got["warmpath_router_queue_seconds_bucket"] == 1 + 2 + 2   # le=0.1, le=1, le=+Inf
    assert "other_metric" not in got
    assert "warmpath_kv_tier_loaded_tokens_total" not in got

"""The one percentile function and the router's use of it (summary and /metrics gauges)."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from warmpath.router.metrics import RouterMetrics
from warmpath.stats import percentile


def test_percentile_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]                  # unsorted on purpose
    assert percentile(xs, 50) == 2.5           # pos 1.5: 2 + 0.5 * (3 - 2)
    assert percentile(xs, 90) == pytest.approx(3.7)   # pos 2.7: 3 + 0.7 * (4 - 3)
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None
    assert percentile(iter([]), 50) is None    # any iterable, e.g. the router's deques


def test_router_summary_and_gauges_interpolate():
    m = RouterMetrics(window=4)
    for t in (9.0, 1.0, 2.0, 3.0, 4.0):       # the window keeps the last four: 1, 2, 3, 4
        m.first_token("cold", t, t / 10)
    s = m.summary()
    assert s["ttft_cold"]["p50"] == 2.5
    assert s["ttft_cold"]["p90"] == pytest.approx(3.7)
    assert s["ttft_cold"]["n"] == 4
    assert s["queue_cold"]["p50"] == pytest.approx(0.25)
    assert s["ttft_warm"] == {"p50": None, "p90": None, "n": 0}
    text = m.render(in_flight=0, waiting=0).decode()
    gauges = {(x.labels["metric"], x.labels["cls"], x.labels["q"]): x.value
              for f in text_string_to_metric_families(text) for x in f.samples
              if x.name == "warmpath_router_latency_quantile_seconds"}
    assert gauges == {("ttft", "cold", "0.5"): 2.5, ("ttft", "cold", "0.9"): pytest.approx(3.7),
                      ("queue", "cold", "0.5"): pytest.approx(0.25),
                      ("queue", "cold", "0.9"): pytest.approx(0.37)}

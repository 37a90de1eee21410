"""The router's size gauges on /metrics: sessions and the global KV index per set."""

import httpx

from tests.conftest import serve_process
from warmpath.bench.prom import sample_value
from warmpath.router.metrics import RouterMetrics


def test_render_exposes_sessions_and_index_sizes():
    m = RouterMetrics()
    text = m.render(in_flight=1, waiting=0, sessions=7, index_blocks={"local": 30, "l3": 12, "approx": 5}).decode()
    assert sample_value(text, "warmpath_router_sessions") == 7
    assert sample_value(text, "warmpath_router_index_blocks", set="local") == 30
    assert sample_value(text, "warmpath_router_index_blocks", set="l3") == 12
    assert sample_value(text, "warmpath_router_index_blocks", set="approx") == 5
    text = m.render(in_flight=0, waiting=0, sessions=2, index_blocks={"local": 0, "l3": 12, "approx": 0}).decode()
    assert sample_value(text, "warmpath_router_sessions") == 2       # a gauge: it goes down too
    assert sample_value(text, "warmpath_router_index_blocks", set="local") == 0


def test_a_router_process_serves_the_size_gauges():
    with serve_process("--route-policy", "cpd", command="router") as base:
        text = httpx.get(base + "/metrics").text
    assert sample_value(text, "warmpath_router_sessions") == 0
    assert {s: sample_value(text, "warmpath_router_index_blocks", set=s) for s in ("local", "l3", "approx")} == {
        "local": 0, "l3": 0, "approx": 0}

"""``bench/requests_log.py``: what a warmpath router reports of a request's path, and the
``requests.jsonl`` that ``write_results`` writes beside ``summary.json``."""

import json

import httpx
import pytest

from warmpath.bench.metrics import Record
from warmpath.bench.requests_log import request_row, route_from_http, server_timing
from warmpath.bench.sweep import sweep_summary, write_results


def test_server_timing_in_seconds():
    assert server_timing("route;dur=1.5, prefill;dur=20.0, decode_first;desc=x;dur=2") == {
        "route": 0.0015, "prefill": 0.02, "decode_first": 0.002}
    assert server_timing(None) is None and server_timing("route") is None


def test_route_of_a_disaggregated_and_a_local_request():
    usage = {"warmpath": {"prefill": {"cached_tokens": 32, "cached_by_tier": {"L1": 16, "L2": 0, "L3": 16}},
                          "decode": {"loaded_tokens": {"L3": 64}, "recomputed_tokens": 0}}}
    h = httpx.Headers({"X-Warmpath-Route": "warm", "X-Warmpath-Decode": "decode-0",
                       "X-Warmpath-Worker": "prefill-1", "Server-Timing": "route;dur=1.0"})
    assert route_from_http(h, usage) == {"path": "warm", "prefill": "prefill-1", "decode": "decode-0", "ppd": None,
                                         "cached_by_tier": {"L1": 16, "L2": 0, "L3": 16},
                                         "predicted_ttft_s": None, "server_timing": {"route": 0.001},
                                         "predicted_tpot_s": None, "ppd_reason": None}
    local = {"X-Warmpath-Route": "local", "X-Warmpath-Decode": "decode-0", "X-Warmpath-Worker": "decode-0"}
    got = route_from_http(local, {"warmpath": {"worker": {"loaded_tokens": {"L1": 48}, "recomputed_tokens": 9}}})
    assert (got["path"], got["prefill"], got["ppd"], got["cached_by_tier"]) == ("local", None, "local", {"L1": 48})
    # the goodput policy's predictions (routing/views.predicted_headers)
    got = route_from_http({**local, "X-Warmpath-Predicted-TTFT-S": "0.125000",
                           "X-Warmpath-Predicted-TPOT-S": "0.015000"}, None)
    assert (got["path"], got["predicted_ttft_s"], got["predicted_tpot_s"]) == ("local", 0.125, 0.015)
    assert route_from_http({"X-Warmpath-Predicted-TPOT-S": "x"}, None)["predicted_tpot_s"] is None
    # the PPD switch's score (router/views.predicted_headers), for a turn it decided
    assert route_from_http({**local, "X-Warmpath-PPD": "S=0.100 (dTTFT +0.10, dTPOT +0.00, 0 running, model, "
                            "bucket (1, 1, 0))"}, None)["ppd_reason"].startswith("S=0.100")
    # another server: nothing known
    assert set(route_from_http({}, None).values()) == {None}


def test_requests_jsonl_beside_summary(tmp_path):
    ok = Record("s1", 1, "warm", True, 0.5, 1.5, 11, 100, 64, route={"path": "replica", "decode": "replica-1"})
    bad = Record("s2", 2, "cold", False, error="TimeoutError: ")
    rows = [request_row(ok, 0.2, True), request_row(bad, 0.2, False)]
    assert rows[0]["tpot_s"] == pytest.approx(0.1) and rows[0]["decode"] == "replica-1" and rows[0]["prefill"] is None
    runs = {0.2: {"classes": {"all": {}}, "requests": rows, "attained": False, "slo_met": False}}
    summary = {"target": "x", **sweep_summary(runs, "ttft_p90=2")}
    assert summary["goodput"] == {"offered_rps": None, "achieved_rps": None, "attainment": None}
    assert summary["slo"] == {"ttft_p90": 2.0} and summary["slo_target"]["attain"] == 0.9
    summary["rates"] = {}
    write_results(tmp_path, summary)
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [(x["sid"], x["class"], x["ok"], x["rate"], x["attained"]) for x in lines] == [
        ("s1", "warm", True, 0.2, True), ("s2", "cold", False, 0.2, False)]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert "requests" not in written and "requests" not in written["runs"]["0.2"]

"""The served phase's arithmetic (warmpath/calibrate/served.py), by hand."""

import pytest

from warmpath.calibrate.served import (ServedCalibrationConfig, overhead_of, server_timing, served_engine,
                                       tier_seconds)
from warmpath.cli import serve_namespace


def test_server_timing_parses_stages_in_seconds():
    assert server_timing("route;dur=0.6, prefill;dur=449.55,prefill_worker;dur=446.15") == {
        "route": 0.0006, "prefill": 0.44955, "prefill_worker": 0.44615}
    assert server_timing("") == {} and server_timing("nodur, x;dur=2") == {"x": 0.002}


def test_overhead_is_the_median_of_client_ttft_less_the_workers_time():
    rows = [{"client_ttft_s": 0.50, "prefill_worker": 0.48}, {"client_ttft_s": 0.30, "prefill_worker": 0.29},
            {"client_ttft_s": 1.00, "prefill_worker": 0.97}, {"client_ttft_s": None, "prefill_worker": 0.1},
            {"client_ttft_s": 0.2}]
    assert overhead_of(rows) == pytest.approx(0.02)         # median of 0.02, 0.01, 0.03
    assert overhead_of([{"client_ttft_s": 0.1, "prefill_worker": 0.2}]) == 0.0   # never negative
    assert overhead_of([]) is None


def test_tier_seconds_sums_every_workers_tier_work():
    steps = {"a": [{"t0": 1.0, "tiers_s": 0.25}, {"t0": 2.0}], "b": [{"t0": 3.0, "tiers_s": 0.5}, {"t0": 4.0, "tiers_s": 0.125}]}
    assert tier_seconds(steps) == 0.875
    assert tier_seconds(steps, since=3.0) == 0.625      # the steps that began at 3 s or later


def test_config_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="sequential"):
        ServedCalibrationConfig(sequential=2)
    with pytest.raises(ValueError, match="rates"):
        ServedCalibrationConfig(rates=())
    with pytest.raises(ValueError, match="rates"):
        ServedCalibrationConfig(rates=(0.1, 0.0))


def test_served_engine_sizes_as_serve_does():
    """SmolLM2 (8,192 positions), 16-token blocks of 46,080 B/token: auto L1 = one context window
    = 512 blocks; auto L2 = as many; the cpd-1d store holds 3 workers' L1."""
    bb = 16 * 46080
    e = served_engine(serve_namespace(["--topology", "cpd-1d"]), 8192, bb, 3)
    assert (e["l1_blocks"], e["l2_blocks"], e["block_size"]) == (512, 512, 16)
    assert e["l3_gib"] == pytest.approx(3 * 512 * bb / (1 << 30), rel=1e-6)
    assert (e["max_num_seqs"], e["max_num_batched_tokens"]) == (64, 512)
    e = served_engine(serve_namespace(["--topology", "cpd-1d", "--kv-cache-gib", "0.5", "--l2-gib", "0",
                                       "--no-l3", "--max-model-len", "4096"]), 8192, bb, 3)
    assert (e["l1_blocks"], e["l2_blocks"], e["l3_gib"]) == ((1 << 29) // bb, 0, 0.0)


def test_the_served_phase_measures_a_real_cluster_and_stops_it(tmp_path):
    """Real processes: cpd-1d started as `warmpath serve` starts it, 3 requests one at a time,
    a few seconds of load; the overhead is a small positive time, every worker left a step
    trace, and nothing started here is left running."""
    import os

    from warmpath.calibrate.served import run_served
    from warmpath.engine.step_trace import read_step_trace

    def children() -> set[int]:
        return {int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == os.getpid()}

    before = children()
    got = run_served(ServedCalibrationConfig(sequential=3, rates=(0.5,), duration_s=4.0, scale=0.1), tmp_path)
    assert len(got["requests"]) == 3 and all(r["client_ttft_s"] > r["prefill_worker"] > 0 for r in got["requests"])
    assert 0.0 < got["request_overhead_s"] < 1.0
    steps = read_step_trace(tmp_path / "trace")
    assert sorted(steps) == ["decode-0", "pre-prefill-0", "prefill-0"]   # every worker traced its steps
    assert steps["decode-0"] and steps["pre-prefill-0"]     # cold first turns: pre-prefill, then decode
    assert got["tier_s"] >= 0.0 and (got["transfer_cpu"] is None or got["transfer_cpu"] >= 0.0)
    assert children() <= before


def _ppid(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None

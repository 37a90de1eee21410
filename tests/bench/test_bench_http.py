"""`warmpath bench` against a running warmpath server (real HTTP, streaming)."""

import json
import subprocess
import sys

from tests.conftest import serve_process


def test_bench_cli_against_warmpath(tmp_path):
    with serve_process("--no-l3", "--max-num-batched-tokens", "256") as base:
        out = tmp_path / "run"
        r = subprocess.run(
            [sys.executable, "-m", "warmpath.cli", "bench", "--url", base, "--workload", "coding-agent",
             "--rates", "1,2", "--duration", "4", "--scale", "0.05", "--slo", "ttft_p90=20,tpot=5",
             "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert set(s["rates"]) == {"1.0", "2.0"}
    for rate in ("1.0", "2.0"):
        cls = s["rates"][rate]
        assert set(cls) == {"all", "cold", "warm", "turn1", "turn2+"}
        a = cls["all"]
        assert a["failed"] == 0 and a["completed"] >= 3
        for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_s", "itl_s", "e2e_p50_s",
                  "throughput_tok_s", "goodput_rps"):
            assert a[k] is not None and a[k] >= 0, k
        assert a["ttft_p50_s"] <= a["ttft_p90_s"] <= a["ttft_p99_s"]
    # every rate point gets new prompts (a server keeps the previous point's KV): at 1/s the
    # seeded workload is 3 new documents (no hit at all), at 2/s repositories repeat and hit
    assert s["runs"]["1.0"]["tier_hit_ratio"]["L1"] == 0
    assert s["runs"]["2.0"]["tier_hit_ratio"]["L1"] > 0
    assert s["max_rate_meeting_slo"] == 2.0
    assert (out / "results.csv").read_text().count("\n") == 11
    assert (out / "cpd_fig4.png").stat().st_size > 1000


def test_bench_cli_errors_name_the_problem(tmp_path):
    r = subprocess.run([sys.executable, "-m", "warmpath.cli", "bench", "--url", "http://127.0.0.1:9",
                        "--trace", str(tmp_path / "nope.jsonl"), "--rate", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nope.jsonl" in r.stderr
    r = subprocess.run([sys.executable, "-m", "warmpath.cli", "bench", "--url", "http://127.0.0.1:9",
                        "--workload", "ppd-grid", "--rate", "1", "--slo", "fast=1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--slo" in r.stderr

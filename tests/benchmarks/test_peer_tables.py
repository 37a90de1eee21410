"""The peer comparisons' pure parts with hand-worked numbers: the micro rows (prefill tok/s from
the TTFT), the sustained-rate rows, the side-by-side table, the fleet's topology and process
facts, the unloaded TPOT and a sweep re-judged under a joint target."""

import os

import pytest

from benchmarks.peers.fleet import median_tpot, pd_topology, processes, topology
from benchmarks.peers.http_micro import micro_rows
from benchmarks.peers.tables import compare_table, ratio, sustained_rows
from benchmarks.peers.vs_vllm import goodput_under, parse_args, threads_note
from benchmarks.policies.ranking import joint_target
from warmpath.vllm.worker import cpu_string


def _micro(tpot: float, tok_s: float, tpot16: float, ttft: float) -> dict:
    return {"decode_batch1": {"tpot_s": tpot}, "decode_x16": {"tok_s": tok_s, "tpot_s": tpot16},
            "prefill": {"ttft_s": ttft}}


def test_micro_rows_scale_to_ms_and_derive_prefill_tok_s_from_the_ttft():
    rows = micro_rows({"warmpath": _micro(0.033, 180.0, 0.08, 4.0), "vllm": _micro(0.011, 320.0, 0.05, 2.56)},
                      16, 2048)
    got = {label: (v, lower) for label, v, lower in rows}
    assert got["decode batch-1 TPOT ms"][0] == pytest.approx({"warmpath": 33.0, "vllm": 11.0})
    assert got["decode x16 output tok/s"] == ({"warmpath": 180.0, "vllm": 320.0}, False)
    # 2048 tokens / 4.0 s = 512 tok/s; 2048 / 2.56 s = 800 tok/s
    assert got["prefill tok/s (the 2048 tokens / that TTFT)"] == ({"warmpath": 512.0, "vllm": 800.0}, False)
    assert got["prefill TTFT s (cold 2048-token prompt, max_tokens 1)"] == ({"warmpath": 4.0, "vllm": 2.56}, True)


def test_micro_rows_leave_a_missing_measurement_missing():
    rows = micro_rows({"warmpath": {"prefill": {"ttft_s": None}}}, 16, 2048)
    assert all(v == {"warmpath": None} for _, v, _ in rows)


def test_compare_table_divides_the_first_engine_by_the_second():
    rows = [("decode batch-1 TPOT ms", {"warmpath": 33.0, "vllm": 11.0}, True),
            ("prefill tok/s", {"warmpath": 512.0, "vllm": None}, False)]
    assert compare_table(rows, ("warmpath", "vllm")) == [
        "| measurement | warmpath | vllm | warmpath / vllm |", "|---|---:|---:|---:|",
        "| decode batch-1 TPOT ms (lower is better) | 33.000 | 11.000 | 3.00 |",
        "| prefill tok/s (higher is better) | 512.000 | - | - |"]
    assert ratio(1.0, 0.0) is None and ratio(None, 2.0) is None and ratio(3.0, 2.0) == 1.5


def test_sustained_rows_one_per_seed_then_the_median_with_none_as_zero():
    runs = {"warmpath": [{"max_rate_meeting_slo": 0.4}, {"max_rate_meeting_slo": 0.8},
                         {"max_rate_meeting_slo": 0.2}],
            "vllm": [{"max_rate_meeting_slo": 0.1}, {"max_rate_meeting_slo": None}, {"max_rate_meeting_slo": 0.2}]}
    rows = sustained_rows(runs, "rate")
    assert [r[0] for r in rows] == ["rate, seed run 1", "rate, seed run 2", "rate, seed run 3", "rate, median"]
    assert rows[1][1] == {"warmpath": 0.8, "vllm": None}
    assert rows[3] == ("rate, median", {"warmpath": 0.4, "vllm": 0.1}, False)   # medians of {.2,.4,.8}, {0,.1,.2}
    assert sustained_rows({"warmpath": [{"max_rate_meeting_slo": 0.4}], "vllm": []}, "rate") == [
        ("rate", {"warmpath": 0.4, "vllm": None}, False)]


def test_topology_pins_as_given_and_names_the_engine():
    assert topology("vllm", 1, {"replica-0": "0-1"}) == {"policy": "replica", "workers": {"replica": 1},
                                                         "engine": "vllm", "cpus": {"replica-0": "0-1"}}
    assert topology("warmpath", 2) == {"policy": "replica", "workers": {"replica": 2}, "engine": "warmpath"}
    assert pd_topology("vllm", "x1", {"prefill-0": "0", "decode-0": "1"}) == {
        "policy": "pd", "ppd": "x1", "workers": {"prefill": 1, "decode": 1}, "engine": "vllm",
        "cpus": {"prefill-0": "0", "decode-0": "1"}}


def test_processes_reads_this_process_from_proc():
    rows = processes(os.getpid())
    me = rows[0]
    assert me["pid"] == os.getpid() and me["cpus"] == cpu_string(os.sched_getaffinity(0))
    assert me["threads"] >= 1 and "pytest" in me["command"]
    assert processes(2 ** 22 + 7) == []     # above Linux's pid_max: no such process


def test_threads_note_says_how_each_engine_got_its_threads():
    assert threads_note("warmpath", "0-1") == "worker pinned to CPUs 0-1; --threads 2 (torch threads)"
    assert threads_note("vllm", "0-1") == ("worker + vLLM pinned to CPUs 0-1; VLLM_CPU_OMP_THREADS_BIND=0-1 "
                                           "(2 OpenMP threads)")


def _row(rate: float, cls: str, ttft: float, e2e: float, i: int) -> dict:
    return {"rate": rate, "sid": f"s{rate}-{i}", "turn": 1, "class": cls, "ok": True, "error": None,
            "ttft_s": ttft, "e2e_s": e2e, "output_tokens": 11, "prompt_tokens": 100, "cached_tokens": 0,
            "tpot_s": (e2e - ttft) / 10}


def test_median_tpot_of_the_requests_that_succeeded():
    rows = [_row(0, "cold", 1.0, 2.0, 0), _row(0, "cold", 1.0, 4.0, 1), _row(0, "cold", 1.0, 1.5, 2),
            {**_row(0, "cold", 1.0, 9.0, 3), "ok": False}]
    assert median_tpot(rows) == pytest.approx(0.1)       # of 0.1, 0.3, 0.05
    with pytest.raises(RuntimeError, match="no request with a TPOT"):
        median_tpot([{**rows[0], "ok": False}])


def test_goodput_under_the_joint_target_stops_at_the_first_missed_rate():
    target = joint_target(0.1)      # warm TTFT p90 <= 2 s, cold <= 20 s, TPOT p90 <= 0.15 s, 90% attaining
    assert target.spec() == "tpot_p90=0.15,cold.ttft_p90=20,warm.ttft_p90=2"

    def point(rate: float, slow: int) -> list[dict]:
        # 5 warm (TTFT 0.5 s) + 5 cold (TTFT 3 s) requests, TPOT 0.1 s; `slow` of them TPOT (4-1)/10 = 0.3 s
        rows = [_row(rate, "warm" if i < 5 else "cold", 0.5 if i < 5 else 3.0, (0.5 if i < 5 else 3.0) + 1.0, i)
                for i in range(10)]
        for r in rows[:slow]:
            r["e2e_s"] = r["ttft_s"] + 3.0
        return rows
    # 0.1 met; 0.2: 2 of 10 too slow → 80% attain < 90%, missed; 0.4 met again but above a miss
    assert goodput_under(point(0.1, 0) + point(0.2, 2) + point(0.4, 0), 60, target) == 0.1
    assert goodput_under(point(0.1, 0) + point(0.4, 0), 60, target) == 0.4
    assert goodput_under(point(0.1, 1) + point(0.4, 0), 60, target) is None   # one slow warm: warm 4/5 = 80%


def test_vs_vllm_rejects_bad_flags_by_name(capsys):
    for argv, msg in ((["--engines", "warmpath,sglang"], "--engines: unknown ['sglang']"),
                      (["--cpus", "a-b"], "--cpus: expected CPU numbers"),
                      (["--cpus", "100000"], "--cpus: CPU 100000 not available here"),
                      (["--streams", "65"], "--streams ≤ --max-num-seqs"),
                      (["--kv-cache-gib", "0"], "--kv-cache-gib must be a whole number")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert msg in capsys.readouterr().err
    a = parse_args(["--smoke", "--cpus", "0"])
    assert (a.cpus, a.streams, a.prefill_tokens, a.rates, str(a.out)) == ("0", 4, 256, "0.5", "/tmp/vs_vllm_smoke")
    with pytest.raises(SystemExit):
        parse_args(["--slo", "ttft_p90=x"])

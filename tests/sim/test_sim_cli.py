"""``warmpath sim`` and ``warmpath bench --sim`` write the bench's summary.json (same keys)."""

import dataclasses
import json

import pytest

from warmpath.bench.metrics import CLASSES
from warmpath.cli import main


def test_sim_cli_writes_the_bench_summary(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["sim", "--topology", "cpd-1d", "--hardware", "h100", "--tp", "pre-prefill=2,prefill=2",
                 "--workload", "coding-agent", "--rates", "1,2", "--duration", "10", "--scale", "0.25",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert list(s["rates"]) == ["1.0", "2.0"] and s["gpus"] == 5
    for classes in s["rates"].values():
        assert set(classes) == set(CLASSES)
        assert {"ttft_p50_s", "ttft_p90_s", "tpot_s", "goodput_rps", "success_rate"} <= set(classes["all"])
    assert (out / "results.csv").exists() and (out / "cpd_fig4.png").exists()
    assert "events/s" in capsys.readouterr().out


def test_bench_sim_target_and_errors(tmp_path):
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"topology": "ppd-2p2d", "hardware": "b200", "ppd": "x1"}))
    out = tmp_path / "b"
    assert main(["bench", "--sim", str(conf), "--workload", "ppd-grid", "--rate", "2", "--duration", "10",
                 "--scale", "0.25", "--out", str(out), "--quiet"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["runs"]["2.0"]["sim"]["ppd_local"] > 0 and s["rates"]["2.0"]["turn2+"]["completed"] > 0
    assert main(["sim", "--hardware", "cpu", "--workload", "coding-agent"]) == 2   # needs --calibration
    assert main(["sim", "--tp", "prefill=x", "--workload", "coding-agent"]) == 2
    assert main(["sim", "--request-overhead-s", "-1", "--workload", "coding-agent"]) == 2
    assert main(["sim", "--retokenize-miss", "1.5", "--workload", "coding-agent"]) == 2
    conf.write_text("{oops")
    assert main(["bench", "--sim", str(conf), "--workload", "ppd-grid", "--rate", "1"]) == 2


def test_request_overhead_defaults_by_hardware(tmp_path):
    import argparse

    from warmpath.sim.cli import CPU_REQUEST_OVERHEAD_S, CPU_TRANSFER_CORES, add_parser, setup_from_args

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"step_model": {"prefill_coef": [0.1, 1e-3, 0.0], "decode_coef": [0.05, 1e-3, 0.0]},
                               "ppd_table": {}}))
    gpu = setup_from_args(p.parse_args(["sim", "--workload", "coding-agent"]))
    cpu = setup_from_args(p.parse_args(["sim", "--hardware", "cpu", "--calibration", str(cal),
                                        "--workload", "coding-agent"]))
    given = setup_from_args(p.parse_args(["sim", "--request-overhead-s", "0.5", "--workload", "coding-agent"]))
    assert (gpu.request_overhead_s, cpu.request_overhead_s, given.request_overhead_s) == (
        0.0, CPU_REQUEST_OVERHEAD_S, 0.5)
    assert (gpu.transfer_cpu, cpu.transfer_cpu) == (0.0, CPU_TRANSFER_CORES)
    assert (cpu.step_cv, cpu.contention, cpu.seed) == (0.0, 0.0, 0)
    # a calibration fitted on served traces carries the steps' scatter and contention
    cal.write_text(json.dumps({**json.loads(cal.read_text()), "step_cv": 0.045, "contention": 0.05}))
    traced = setup_from_args(p.parse_args(["sim", "--hardware", "cpu", "--calibration", str(cal), "--seed", "3",
                                           "--workload", "coding-agent"]))
    assert (traced.step_cv, traced.contention, traced.seed) == (0.045, 0.05, 3)
    gpu = setup_from_args(p.parse_args(["sim", "--calibration", str(cal), "--workload", "coding-agent"]))
    assert (gpu.step_cv, gpu.contention) == (0.0, 0.0)     # measured on this CPU: not for a GPU
    cal.write_text(json.dumps({**json.loads(cal.read_text()), "contention": -0.02}))   # noise around none
    assert setup_from_args(p.parse_args(["sim", "--hardware", "cpu", "--calibration", str(cal),
                                         "--workload", "coding-agent"])).contention == 0.0


def test_repro_parser():
    from warmpath.cli import main as m
    with pytest.raises(SystemExit):
        m(["repro", "nope"])


def small_trace(path):
    """4 requests at 0, 1, 2, 4 s (own rate 0.75/s); rows 1 and 3 extend rows 0 and 1."""
    rows = [(0, [0, 1]), (1000, [0, 1, 2, 3]), (2000, [7, 8]), (4000, [0, 1, 2, 3, 4, 5])]
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 512 * len(ids), "output_length": 128,
                                        "hash_ids": ids}) + "\n" for t, ids in rows))
    return path


def test_sim_trace_sweeps_speeds_and_rates(tmp_path, capsys):
    tr = small_trace(tmp_path / "t.jsonl")
    base = ["sim", "--topology", "cpd-1d", "--hardware", "h100", "--trace", str(tr), "--trace-block", "16"]
    out = tmp_path / "speeds"
    assert main([*base, "--trace-speed", "1,2", "--slo", "ttft_p90=5", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert list(s["rates"]) == ["0.75", "1.5"] and s["ttft_from"] == "arrival"
    assert [r["trace_speed"] for r in s["runs"].values()] == [1.0, 2.0]
    assert all(r["trace_requests"] == 4 and r["trace_left_out"] == 0 for r in s["runs"].values())
    assert (s["trace_own_rps"], s["max_rate_meeting_slo"], s["max_trace_speed_meeting_slo"]) == (0.75, 1.5, 2.0)
    # classes by what the cache gave: rows 1 and 3 reuse rows 0 and 1's blocks (warm, turn 2+)
    assert s["rates"]["0.75"]["warm"]["completed"] == 2 and s["rates"]["0.75"]["turn2+"]["completed"] == 2
    printed = capsys.readouterr().out
    assert "(2x trace)" in printed and "TTFT (from arrival)" in printed
    out = tmp_path / "rate"
    assert main([*base, "--rates", "3", "--duration", "1", "--out", str(out)]) == 0
    run = json.loads((out / "summary.json").read_text())["runs"]["3.0"]
    assert (run["trace_speed"], run["trace_requests"], run["trace_left_out"]) == (4.0, 3, 1)   # arrivals 0, 0.25, 0.5 (and 1.0, left out)
    assert "--duration 1 s keeps 3 of 4 requests" in capsys.readouterr().err


def test_bench_sim_trace_with_a_client_cap_matches_the_sim(tmp_path):
    tr = small_trace(tmp_path / "t.jsonl")
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"topology": "cpd-1d", "hardware": "h100"}))
    flags = ["--trace", str(tr), "--trace-block", "16", "--trace-speed", "1000", "--max-concurrency", "1"]
    assert main(["bench", "--sim", str(conf), *flags, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert main(["sim", "--topology", "cpd-1d", "--hardware", "h100", *flags, "--out", str(tmp_path / "s")]) == 0
    b, s = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("b", "s"))
    assert b["ttft_from"] == s["ttft_from"] == "send" and b["max_concurrency"] == 1
    assert b["rates"] == s["rates"] and list(b["rates"]) == ["750.0"]
    assert b["rates"]["750.0"]["all"]["client_wait_p90_s"] > 0


def test_shared_flag_errors(tmp_path):
    tr = small_trace(tmp_path / "t.jsonl")
    assert main(["sim", "--trace", str(tr), "--ramp", "5"]) == 2                 # a trace keeps its arrivals
    assert main(["sim", "--workload", "coding-agent", "--trace-speed", "2"]) == 2
    assert main(["sim", "--workload", "coding-agent", "--max-concurrency", "0"]) == 2
    with pytest.raises(SystemExit):
        main(["sim", "--trace", str(tr), "--rates", "1", "--trace-speed", "2"])


def test_repro_cpd_assumption_flags_and_validation():
    import argparse

    from warmpath.sim import repro
    from warmpath.sim.repro import CPDAssumptions, assumptions_from_args
    p = argparse.ArgumentParser()
    repro.add_parser(p.add_subparsers())
    a = p.parse_args(["repro", "cpd", "--model", "llama-3.1-70b", "--context-tokens", "32768", "--doc-tokens",
                      "131072", "--question-tokens", "1024", "--cold-share", "0.4", "--answer-tokens", "64",
                      "--decode-tp", "4", "--max-in-flight", "256", "--max-concurrency", "24", "--ramp", "10"])
    asm = assumptions_from_args(a)
    assert asm == CPDAssumptions("llama-3.1-70b", 32768, 131072, 1024, 0.4, 64, 4, 256, 24, 10.0)
    wl = asm.workload()
    assert (wl["context"], wl["doc_tokens"], wl["question"], wl["answer"]) == (32768, 131072, 1024, 64)
    assert wl["warm_ratio"] == pytest.approx(0.6)
    s = asm.setup("CPD-1D")
    assert s.model.name == "llama-3.1-70b" and s.max_concurrency == 24 and s.admission.max_in_flight == 256
    assert s.topology.workers == {"pre-prefill": 1, "prefill": 1, "decode": 1} and s.gpus == 12
    d = assumptions_from_args(p.parse_args(["repro", "cpd"]))        # defaults: the repro as before
    assert d == CPDAssumptions() and d.workload() == repro.CPD_WORKLOAD and d.max_concurrency is None
    assert d.setup("2P1D").topology.workers == {"prefill": 2, "decode": 4} and d.setup("2P1D").gpus == 12
    # the replica arm: 2P1D's 12 GPUs as 3 TP4 replicas, whatever the decode TP
    assert asm.setup("3R-TP4").topology.workers == {"replica": 3} and asm.setup("3R-TP4").gpus == 12
    assert "3R-TP4" in a.configs.split(",")
    # the path decision on CPD-1D's workers, routing for the repro's target
    g = asm.setup("GP-1D")
    assert (g.topology.policy, g.topology.workers, g.gpus) == ("goodput", {"pre-prefill": 1, "prefill": 1, "decode": 1}, 12)
    assert g.target.flat() == {"ttft_p90": 2.0}
    h = asm.setup("GP-1C2R")        # the same 12 GPUs as a TP4 cold tier beside two TP4 replicas
    assert (h.topology.policy, h.topology.workers, h.gpus) == ("goodput", {"pre-prefill": 1, "replica": 2}, 12)
    assert h.elastic is None           # as `warmpath router` runs goodput: no elastic roles
    from warmpath.sim.run import elastic_config, policy_for
    e = asm.setup("GP-1C2R-E")          # the same under --elastic roles: the cold tier's one node may be lent
    assert (e.topology.workers, e.elastic) == ({"pre-prefill": 1, "replica": 2}, "roles")
    el = elastic_config(e, policy_for(e))
    assert el.enabled and el.spare_last and el.roles == ("pre-prefill", "prefill", "decode", "replica")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.model = "x"
    for kw, msg in ((dict(model="gpt-9"), "--model must be one of"), (dict(cold_share=1.0), "cold_share must be"),
                    (dict(answer_tokens=0), "answer_tokens must be >= 1"), (dict(decode_tp=3), "decode_tp must be"),
                    (dict(max_concurrency=0), "max_concurrency must be >= 1"), (dict(ramp_s=-1), "ramp_s must be")):
        with pytest.raises(ValueError, match=msg):
            CPDAssumptions(**kw)


def test_cpu_profile_defaults_come_from_the_calibrations_served_engine(tmp_path):
    """A calibration with a served phase: its engine sizes, request overhead, transfer CPU and
    re-tokenization miss are the CPU profile's defaults; flags still win; a GPU ignores them."""
    import argparse

    from warmpath.sim.cli import add_parser, setup_from_args

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({
        "step_model": {"prefill_coef": [0.1, 1e-3, 0.0], "decode_coef": [0.05, 1e-3, 0.0]}, "ppd_table": {},
        "request_overhead_s": 0.02, "transfer_cpu": 0.3, "retokenize_miss": 0.125,
        "engine": {"l1_blocks": 512, "l2_blocks": 256, "l3_gib": 1.5, "block_size": 16, "max_num_seqs": 64,
                   "max_num_batched_tokens": 512, "cores": 2}}))
    base = ["sim", "--hardware", "cpu", "--model", "smollm2-135m", "--calibration", str(cal), "--workload",
            "coding-agent"]
    s = setup_from_args(p.parse_args(base))
    # smollm2-135m: 2 · 30 layers · 3 kv heads · 64 dims · 4 bytes = 46,080 B/token; 16-token blocks
    assert (s.kv_blocks, s.l2_gib, s.l3_gib, s.cpu_cores) == (512, 256 * 16 * 46080 / (1 << 30), 1.5, 2)
    assert (s.scheduler.max_num_seqs, s.scheduler.max_num_batched_tokens) == (64, 512)
    assert (s.request_overhead_s, s.transfer_cpu, s.retokenize_miss) == (0.02, 0.3, 0.125)
    given = setup_from_args(p.parse_args([*base, "--cpu-cores", "4", "--l2-gib", "0", "--max-num-batched-tokens",
                                          "2048", "--retokenize-miss", "0", "--request-overhead-s", "0.001"]))
    assert (given.cpu_cores, given.l2_gib, given.scheduler.max_num_batched_tokens) == (4, 0, 2048)
    assert (given.retokenize_miss, given.request_overhead_s) == (0.0, 0.001)
    gpu = setup_from_args(p.parse_args(["sim", "--calibration", str(cal), "--workload", "coding-agent"]))
    assert (gpu.kv_blocks, gpu.l2_gib, gpu.l3_gib, gpu.cpu_cores, gpu.transfer_cpu) == (None, 0, 4096.0, None, 0.0)
    # a GPU worker takes vLLM's defaults on that GPU: a B200 (>= 160 GiB) 1,024 sequences, 16,384 tokens a step
    assert (gpu.scheduler.max_num_seqs, gpu.scheduler.max_num_batched_tokens, gpu.retokenize_miss) == (1024, 16384, 0.125)
    h100 = setup_from_args(p.parse_args(["sim", "--hardware", "h100", "--workload", "coding-agent"]))
    assert (h100.scheduler.max_num_seqs, h100.scheduler.max_num_batched_tokens, h100.memory_share()) == (1024, 8192, 0.92)
    a100 = setup_from_args(p.parse_args(["sim", "--hardware", "a100-80g", "--engine", "vllm", "--max-num-seqs", "64",
                                         "--workload", "coding-agent"]))
    assert (a100.scheduler.max_num_seqs, a100.scheduler.max_num_batched_tokens) == (64, 2048)
    fp8 = setup_from_args(p.parse_args(["sim", "--model", "qwen3-32b", "--weights", "fp8", "--kv-dtype", "fp8",
                                        "--workload", "coding-agent"]))
    assert (fp8.model.dtype_bytes, fp8.model.kv_bytes_per_token) == (1, 2 * 64 * 8 * 128)
    with pytest.raises(ValueError, match="not a bundled model"):
        setup_from_args(p.parse_args(["sim", "--model", "nope/config.json", "--workload", "coding-agent"]))


def test_contention_is_the_calibrations_unless_chosen(tmp_path):
    """The calibration's ``contention``; ``--contention served`` its served phase's (the steps over
    the fit where the calibration has that figure, else the same-shape pairs'), ``timed`` the timed
    one, a number itself; a figure the calibration lacks, a word or a negative number is an error
    naming the flag."""
    import argparse

    from warmpath.sim.cli import add_parser, setup_from_args

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    cal = tmp_path / "cal.json"
    body = {"step_model": {"prefill_coef": [0.1, 1e-3, 0.0], "decode_coef": [0.05, 1e-3, 0.0]}, "ppd_table": {},
            "contention": 0.168, "contention_measured": {"contention": 0.168},
            "trace_variation": {"served": {"contention": 0.052}}}
    cal.write_text(json.dumps(body))
    base = ["sim", "--hardware", "cpu", "--model", "smollm2-135m", "--calibration", str(cal), "--workload",
            "coding-agent"]
    got = lambda *more: setup_from_args(p.parse_args([*base, *more])).contention   # noqa: E731
    assert (got(), got("--contention", "served"), got("--contention", "timed"), got("--contention", "0.1")) == \
        (0.168, 0.052, 0.168, 0.1)
    for bad, msg in (("fast", "timed, served or a number"), ("-0.5", "must be >= 0")):
        with pytest.raises(ValueError, match=f"^--contention: {msg}"):
            got("--contention", bad)
    del body["contention_measured"]
    cal.write_text(json.dumps(body))
    with pytest.raises(ValueError, match="^--contention timed: the calibration has no timed figure"):
        got("--contention", "timed")
    # a calibration with the served steps' figure over the fit: ``served`` is that one
    cal.write_text(json.dumps({**body, "contention": 0.083, "contention_served": {"contention": 0.083}}))
    assert (got(), got("--contention", "served")) == (0.083, 0.083)


def test_kv_dtype_halves_every_block_and_overlap_reaches_the_workers(tmp_path):
    import argparse

    from warmpath.sim.cli import add_parser, setup_from_args
    from warmpath.sim.run import build

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    base = ["sim", "--workload", "coding-agent", "--model", "llama-3.1-8b", "--topology", "cpd-1d"]
    auto = setup_from_args(p.parse_args(base))
    half = setup_from_args(p.parse_args([*base, "--kv-dtype", "float32", "--kv-l3-overlap", "on"]))
    # Llama-3.1-8B: 32 layers x 2 x 8 KV heads x 128 x 2 bytes (the profile's bf16), then float32's 4
    assert (auto.model.kv_bytes_per_token, half.model.kv_bytes_per_token) == (131072, 262144)
    assert (auto.l3_overlap, half.l3_overlap) == (False, True)
    sim = build(half)
    assert sim.kvb == 262144 and all(w.cfg.l3_overlap for w in sim.workers.values())
    with pytest.raises(SystemExit):
        p.parse_args([*base, "--kv-dtype", "int4"])

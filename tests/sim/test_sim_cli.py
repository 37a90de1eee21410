"""``warmpath sim`` and ``warmpath bench --sim`` write the bench's summary.json (same keys)."""

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

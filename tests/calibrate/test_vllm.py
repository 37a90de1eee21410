"""``warmpath calibrate --engine vllm``'s pure parts, hand-worked: a timed prefill from vLLM's
usage, the decode step from streamed token times, the engine profile from vLLM's KV pool, and
the calibration file (fitted by calibrate's own fit) read back by ``warmpath sim``. The real
server is timed in tests/vllm/test_vllm_cluster.py."""

import argparse
import json

import pytest

from warmpath.calibrate.vllm import _flag_int, calibration, decode_step, engine_profile, prefill_row
from warmpath.engine.step_model import StepModel, StepProfile


def test_prefill_row_from_vllms_usage():
    assert prefill_row({"prompt_tokens": 700, "prompt_tokens_details": {"cached_tokens": 512}}, 0.25) == (188, 512, 0.25)
    assert prefill_row({"prompt_tokens": 64, "prompt_tokens_details": None}, 0.1) == (64, 0, 0.1)


def test_decode_step_is_the_median_gap_while_all_decode():
    # request A: tokens every 0.1 s from 1.0; B joins later (first token 1.25) and ends first
    a = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    b = [1.25, 1.35, 1.47, 1.55]
    # window: from max(A[1], B[1]) = 1.35 to min(1.6, 1.55) = 1.55 -> A: 1.4-1.5 (0.1),
    # B: 1.35-1.47 (0.12), 1.47-1.55 (0.08); A's 1.3-1.4 starts before the window
    assert decode_step([a, b]) == pytest.approx(0.1)
    assert decode_step([[0.0, 0.5, 0.7, 1.0]]) == pytest.approx(0.25)      # gaps 0.2, 0.3 after the first
    with pytest.raises(ValueError, match="needs > 2 tokens"):
        decode_step([[0.0, 0.1]])
    with pytest.raises(ValueError, match="never decoded together"):
        decode_step([[0.0, 0.1, 0.2], [5.0, 5.1, 5.2]])


def test_engine_profile_counts_vllms_pool_in_the_simulators_blocks():
    e = engine_profile(727, 32, 8, 2048)
    assert {k: e[k] for k in ("l1_blocks", "l2_blocks", "l3_gib", "block_size", "max_num_seqs",
                              "max_num_batched_tokens")} == {"l1_blocks": 1454, "l2_blocks": 0, "l3_gib": 0.0,
                                                             "block_size": 32, "max_num_seqs": 8,
                                                             "max_num_batched_tokens": 2048}
    with pytest.raises(ValueError, match="cache_config_info"):
        engine_profile(None, 32, 8, 2048)
    assert _flag_int("--enforce-eager --max-num-batched-tokens 4096", "--max-num-batched-tokens", 2048) == 4096
    assert _flag_int("--max-num-batched-tokens=1024", "--max-num-batched-tokens", 2048) == 1024
    assert _flag_int(None, "--max-num-batched-tokens", 2048) == 2048


def exact_profile() -> StepProfile:
    """Steps on exact lines: prefill 0.02 + 1e-3·t + 1e-7·t·c, decode 0.03 + 2e-3·b + 1e-7·b·c."""
    pre = [(t, c, 0.02 + 1e-3 * t + 1e-7 * t * c) for c in (0, 256, 1024) for t in (32, 128, 512)]
    dec = [(b, c, 0.03 + 2e-3 * b + 1e-7 * b * c) for c in (100, 600) for b in (1, 4, 16)]
    return StepProfile(pre, dec, [])


def test_calibration_file_is_calibrates_format_and_the_simulator_reads_it(tmp_path):
    from warmpath.sim.cli import add_parser, setup_from_args

    model, out = calibration(exact_profile(), 46080, engine_profile(727, 32, 8, 2048))
    assert model.prefill_coef == pytest.approx((0.02, 1e-3, 1e-7)) and model.decode_coef == pytest.approx((0.03, 2e-3, 1e-7))
    assert model.mixed_coef == () and out["calibrated_engine"] == "vllm" and out["kv_bytes_per_token"] == 46080
    assert StepModel.from_json(out["step_model"]) == model and len(out["profile"]["prefill"]) == 9
    assert len(out["ppd_table"]) > 0
    cal = tmp_path / "vllm.json"
    cal.write_text(json.dumps(out))
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    s = setup_from_args(p.parse_args(["sim", "--hardware", "cpu", "--calibration", str(cal), "--topology", "replica",
                                      "--workload", "coding-agent"]))
    assert s.fitted == model and s.kv_blocks == 1454 and s.l2_gib == 0
    assert (s.scheduler.max_num_seqs, s.scheduler.max_num_batched_tokens) == (8, 2048)


def test_bad_flags_and_an_unreachable_server_are_cli_errors(capsys):
    from tests.conftest import free_port
    from warmpath.cli import main

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["calibrate", "--engine", "vllm", "--url", url, "--batches", "1,x"]) == 2
    assert "--batches" in capsys.readouterr().err
    assert main(["calibrate", "--engine", "vllm", "--url", url, "--batches", "1,128"]) == 2   # > --max-num-seqs 64
    assert "max_num_seqs 64" in capsys.readouterr().err
    assert main(["calibrate", "--engine", "vllm", "--url", url, "--quick"]) == 2
    assert f"--url {url}: not a vLLM OpenAI server" in capsys.readouterr().err

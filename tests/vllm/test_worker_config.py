"""The vLLM worker's setup: the model directory vLLM loads, the block size, the namespace it
registers, the flags it refuses."""

import json

import pytest

from warmpath.cli import build_parser
from warmpath.models.gguf_loader import ModelFileError
from warmpath.vllm.model_dir import vllm_model_dir, with_model_type
from warmpath.vllm.worker import namespace, server_config, vllm_block_size


def test_model_dir_links_the_converted_files_and_adds_model_type(tmp_path):
    from warmpath.models.files import spec_dir

    src = spec_dir("smollm2")
    out = vllm_model_dir("smollm2", root=tmp_path)
    assert out == tmp_path / src.name
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in src.iterdir())
    assert (out / "model.safetensors").resolve() == (src / "model.safetensors").resolve()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == {**json.loads((src / "config.json").read_text()), "model_type": "llama"}
    assert vllm_model_dir("smollm2", root=tmp_path) == out          # idempotent
    assert "model_type" not in json.loads((src / "config.json").read_text())   # source untouched
    with pytest.raises(ModelFileError, match="no known model_type"):
        with_model_type({"architectures": ["GPT2LMHeadModel"]})


def test_block_size_is_rounded_to_vllm_cpus_multiple_of_32():
    assert [vllm_block_size(b) for b in (16, 32, 48, 64)] == [32, 32, 64, 64]
    with pytest.raises(ValueError):
        vllm_block_size(0)


def test_namespace_and_server_flags(tmp_path):
    from warmpath.models.files import spec_dir

    ns = namespace("SmolLM2-135M-Instruct", spec_dir("smollm2"), "auto", 32)
    assert (ns.model_id, ns.dtype, ns.block_size) == ("SmolLM2-135M-Instruct", "vllm-auto", 32)
    assert ns.revision == f"vllm:{spec_dir('smollm2').name}" and len(ns.tokenizer) == 16
    a = build_parser().parse_args(["worker", "--engine", "vllm", "--router", "http://r:1", "--block-size", "32",
                                   "--vllm-python", "/py", "--vllm-args", "--enforce-eager --seed 3"])
    cfg = server_config(a, tmp_path, "M", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    assert (cfg.python, cfg.kv_cache_gib, cfg.block_size, cfg.extra_args) == (
        "/py", 1, 32, ("--enforce-eager", "--seed", "3"))
    a.role = "decode"
    with pytest.raises(ValueError, match="replica only"):
        server_config(a, tmp_path, "M", "tcp://127.0.0.1:1", None)
    a.role, a.kv_cache_gib = "replica", 0.5
    with pytest.raises(ValueError, match="whole number"):
        server_config(a, tmp_path, "M", "tcp://127.0.0.1:1", None)


def test_cpu_string_writes_runs_as_vllm_reads_them():
    from warmpath.vllm.worker import cpu_string

    assert cpu_string({0, 1, 2, 5}) == "0-2,5"
    assert cpu_string([3]) == "3"
    assert cpu_string({7, 1, 0, 8, 4}) == "0-1,4,7-8"


def test_threads_bind_defaults_to_this_process_affinity(tmp_path):
    import os

    a = build_parser().parse_args(["worker", "--engine", "vllm", "--router", "http://r:1"])
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        cfg = server_config(a, tmp_path, "m", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
        assert cfg.threads_bind == str(min(before))
    finally:
        os.sched_setaffinity(0, before)

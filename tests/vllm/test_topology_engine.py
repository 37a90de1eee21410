"""Topology files naming the engine per role, and what `warmpath serve` passes the workers."""

import json

import pytest

from warmpath.launch.topology import Topology, resolve


def test_topology_file_names_the_engine(tmp_path):
    f = tmp_path / "mixed.json"
    f.write_text(json.dumps({"policy": "replica", "workers": {"replica": 2}, "engine": "vllm"}))
    assert resolve(str(f)).engines == {"replica": "vllm"}
    f.write_text(json.dumps({"policy": "cpd", "workers": {"pre-prefill": 1, "prefill": 1, "decode": 1},
                             "engines": {"decode": "warmpath"}, "engine": "vllm"}))
    assert resolve(str(f)).engines == {"pre-prefill": "vllm", "prefill": "vllm", "decode": "warmpath"}
    with pytest.raises(ValueError, match="engines must map"):
        Topology("t", "replica", {"replica": 1}, engines={"replica": "sglang"})


def test_serve_engine_flags_reach_the_workers(monkeypatch):
    import warmpath.cli as cli
    from warmpath.launch.launcher import worker_argv

    got = []
    monkeypatch.setattr(cli, "_serve", lambda a: got.append(a) or 0)
    assert cli.main(["serve", "--topology", "replica", "--engine", "vllm", "--vllm-python", "/opt/v/bin/python",
                     "--vllm-cpus", "0-1", "--vllm-startup-s", "300"]) == 0
    argv = worker_argv(got[0])
    i = argv.index("--engine")
    assert argv[i:i + 4] == ["--engine", "vllm", "--vllm-startup-s", "300.0"]
    assert argv[argv.index("--vllm-python") + 1] == "/opt/v/bin/python" and argv[argv.index("--vllm-cpus") + 1] == "0-1"
    assert "--vllm-command" not in argv


def test_serve_engine_vllm_needs_a_topology(capsys):
    import warmpath.cli as cli

    assert cli.main(["serve", "--engine", "vllm"]) == 2
    assert "needs a --topology" in capsys.readouterr().err

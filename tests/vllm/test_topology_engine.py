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


def test_pd_roles_hand_off_within_one_engine(tmp_path):
    pd = {"prefill": 1, "decode": 1}
    Topology("t", "pd", pd, engines={"prefill": "vllm", "decode": "vllm"}).check_handoff("warmpath", "nixl")
    Topology("t", "pd", pd).check_handoff("vllm", "nixl")                  # serve --engine vllm: every role
    Topology("t", "pd", pd).check_handoff("warmpath", None)
    with pytest.raises(ValueError, match=r"different engines \({'prefill': 'warmpath', 'decode': 'vllm'}\); a hand-off "
                                         "never crosses engines"):
        Topology("t", "pd", pd, engines={"decode": "vllm"}).check_handoff("warmpath", "nixl")
    with pytest.raises(ValueError, match="different engines"):
        Topology("t", "cpd", {"pre-prefill": 1, "prefill": 1, "decode": 1},
                 engines={"pre-prefill": "warmpath"}).check_handoff("vllm", "nixl")
    with pytest.raises(ValueError, match="need --vllm-kv-connector"):
        Topology("t", "pd", pd).check_handoff("vllm", None)
    Topology("t", "replica", {"replica": 2}).check_handoff("vllm", None)   # replicas hand nothing off


def test_cli_refuses_pd_without_a_connector_before_starting_anything(tmp_path, capsys):
    import warmpath.cli as cli

    f = tmp_path / "vllm-pd.json"
    f.write_text(json.dumps({"policy": "pd", "workers": {"prefill": 1, "decode": 1}, "engine": "vllm"}))
    assert cli.main(["serve", "--topology", str(f), "--engine", "vllm"]) == 2
    assert "need --vllm-kv-connector" in capsys.readouterr().err
    assert cli.main(["worker", "--engine", "vllm", "--router", "http://127.0.0.1:9", "--role", "prefill"]) == 2
    assert "--role prefill needs a KV connector" in capsys.readouterr().err
    assert cli.main(["worker", "--engine", "vllm", "--router", "http://127.0.0.1:9", "--role", "decode",
                     "--vllm-kv-connector", "lmcache"]) == 2
    assert "--vllm-kv-connector must be one of" in capsys.readouterr().err


def test_serve_passes_the_connector_flags(monkeypatch, tmp_path):
    import warmpath.cli as cli
    from warmpath.launch.launcher import worker_argv

    f = tmp_path / "vllm-pd.json"
    f.write_text(json.dumps({"policy": "pd", "workers": {"prefill": 1, "decode": 1}, "engine": "vllm"}))
    got = []
    monkeypatch.setattr("warmpath.launch.launcher.serve_cluster", lambda a, model_id: got.append(a) or 0)
    assert cli.main(["serve", "--topology", str(f), "--engine", "vllm", "--vllm-kv-connector", "nixl",
                     "--vllm-kv-buffer-device", "cpu"]) == 0
    argv = worker_argv(got[0])
    assert argv[argv.index("--vllm-kv-connector") + 1] == "nixl"
    assert argv[argv.index("--vllm-kv-buffer-device") + 1] == "cpu"

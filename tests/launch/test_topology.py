"""Named topologies and topology files (pure)."""

import json

import pytest

from warmpath.launch.topology import TOPOLOGIES, Topology, resolve


def test_named_topologies():
    assert sorted(TOPOLOGIES) == ["cpd-1d", "cpd-2d", "pd-2p1d", "pd-2p2d", "ppd-1p3d", "ppd-2p2d",
                                  "ppd-3p1d", "replica", "replica-2", "replica-3"]
    # replicas at the core counts of the 2- and 3-worker splits
    assert resolve("replica-2").workers == {"replica": 2} and resolve("replica-3").workers == {"replica": 3}
    cpd = resolve("cpd-1d")
    assert (cpd.policy, cpd.ppd, cpd.size) == ("cpd", "off", 3)
    assert cpd.roles() == [("pre-prefill-0", "pre-prefill"), ("prefill-0", "prefill"), ("decode-0", "decode")]
    assert resolve("pd-2p1d").roles() == [("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode")]
    ppd = resolve("ppd-1p3d")
    assert (ppd.policy, ppd.ppd, ppd.workers) == ("pd", "dynamic", {"prefill": 1, "decode": 3})
    assert resolve("ppd-1p3d", "x1").ppd == "x1"


def test_topology_file(tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"policy": "cpd", "ppd": "x1", "workers": {"pre-prefill": 2, "prefill": 1, "decode": 1}}))
    t = resolve(str(f))
    assert (t.name, t.policy, t.ppd, t.size) == ("mine", "cpd", "x1", 4)
    f.write_text("{\"workers\": 3}")
    with pytest.raises(ValueError, match="expected"):
        resolve(str(f))


@pytest.mark.parametrize("kwargs, msg", [
    ({"policy": "nope", "workers": {"replica": 1}}, "policy must be one of"),
    ({"policy": "cpd", "workers": {"decoder": 1}}, "unknown roles"),
    ({"policy": "cpd", "workers": {"prefill": 1}}, "needs prefill-type and decode"),
    ({"policy": "replica", "workers": {"replica": 1, "decode": 1}}, "only replica"),
    ({"policy": "goodput", "workers": {"prefill": 1, "pre-prefill": 1}}, "goodput needs decode workers or replicas"),
    ({"policy": "cpd", "workers": {"pre-prefill": 1, "replica": 1}}, "needs prefill-type and decode"),
    ({"policy": "pd", "workers": {"prefill": 1, "decode": 1}, "ppd": "x2"}, "ppd must be"),
    ({"policy": "pd", "workers": {"prefill": 0, "decode": 0}}, "at least one"),
])
def test_bad_topologies(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        Topology("t", **kwargs)


def test_unknown_name_and_missing_file():
    with pytest.raises(ValueError, match="neither"):
        resolve("cpd-9d")
    with pytest.raises(ValueError, match="no such file"):
        resolve("/nonexistent/t.json")


def test_serve_passes_its_generation_override_to_the_workers(monkeypatch):
    import warmpath.cli as cli
    from warmpath.launch.launcher import worker_argv

    got = []
    monkeypatch.setattr(cli, "_serve", lambda a: got.append(a) or 0)
    assert cli.main(["serve", "--topology", "cpd-1d", "--override-generation-config", '{"min_p": 0.05}']) == 0
    argv = worker_argv(got[0])
    assert argv[argv.index("--override-generation-config") + 1] == '{"min_p": 0.05}'
    assert cli.main(["serve", "--topology", "cpd-1d"]) == 0
    assert "--override-generation-config" not in worker_argv(got[1])


def _worker_argvs(monkeypatch, *extras: list[str]) -> list[list[str]]:
    """The workers' argv of ``warmpath serve --topology cpd-1d`` with each of ``extras``."""
    from warmpath import cli
    from warmpath.launch.launcher import worker_argv

    got = []
    monkeypatch.setattr(cli, "_serve", lambda a: got.append(a) or 0)
    for extra in extras:
        assert cli.main(["serve", "--topology", "cpd-1d", *extra]) == 0
    return [worker_argv(a) for a in got]


def test_serve_passes_attention_and_compile_to_the_workers(monkeypatch):
    on, default = _worker_argvs(monkeypatch, ["--compile", "on", "--attention", "gather"], [])
    assert on[on.index("--compile") + 1] == "on" and on[on.index("--attention") + 1] == "gather"
    assert default[default.index("--compile") + 1] == "off" and default[default.index("--attention") + 1] == "paged"


def test_serve_passes_the_kv_dtype_and_decode_threads_to_the_workers(monkeypatch):
    from warmpath import cli

    half, default = _worker_argvs(monkeypatch, ["--kv-dtype", "float16", "--decode-threads", "1"], [])
    assert half[half.index("--kv-dtype") + 1] == "float16" and half[half.index("--decode-threads") + 1] == "1"
    assert default[default.index("--kv-dtype") + 1] == "auto" and "--decode-threads" not in default
    with pytest.raises(SystemExit):          # argparse names the bad choice and exits 2
        cli.main(["serve", "--topology", "cpd-1d", "--kv-dtype", "int4"])

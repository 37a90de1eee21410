"""``warmpath deploy --ray``'s plan (no Ray): names, resources, argv, which workers a scale
starts or drains; and that nothing imports Ray unless a deploy runs."""

import subprocess
import sys

import pytest

from warmpath.cli import build_parser
from warmpath.deploy.cli import config
from warmpath.deploy.placement import (
    RayDeployConfig,
    is_store,
    kv_store,
    parse_amounts,
    proc_of,
    role_of,
    router_argv,
    scale_plan,
    segment_argv,
    worker_argv,
)
from warmpath.launch.topology import TOPOLOGIES


def test_scale_plan_adds_lowest_free_numbers_and_drains_highest_first():
    running = ["store", "router", "pre-prefill-0", "prefill-0", "decode-0"][2:]
    assert scale_plan(running, "prefill", 2) == (["prefill-1"], [])
    assert scale_plan(running, "prefill", 1) == ([], [])
    assert scale_plan(["prefill-0", "prefill-1", "prefill-2", "decode-0"], "prefill", 1) == ([], ["prefill-2", "prefill-1"])
    assert scale_plan(["prefill-1", "decode-3"], "prefill", 3) == (["prefill-0", "prefill-2"], [])
    assert scale_plan(["decode-0"], "pre-prefill", 0) == ([], [])
    with pytest.raises(ValueError, match="'boss' is not a role"):
        scale_plan([], "boss", 1)
    with pytest.raises(ValueError, match="count >= 0"):
        scale_plan([], "decode", -1)


def test_names_and_roles():
    assert proc_of("warmpath:pre-prefill-0") == "pre-prefill-0" and proc_of("other") is None
    assert [p for p in ("store", "store-2", "store-x", "router", "prefill-0") if is_store(p)] == ["store", "store-2"]
    assert role_of("pre-prefill-12") == "pre-prefill"
    with pytest.raises(ValueError, match="not a worker"):
        role_of("router")


def test_resources_per_kind():
    cfg = RayDeployConfig(TOPOLOGIES["cpd-1d"], cpus=parse_amounts(["decode=2", "router=0.5"], "--cpus"),
                          gpus=parse_amounts(["prefill=1"], "--gpus"))
    assert cfg.resources("decode") == {"num_cpus": 2.0, "num_gpus": 0}
    assert cfg.resources("prefill") == {"num_cpus": 1, "num_gpus": 1.0}
    assert cfg.resources("router") == {"num_cpus": 0.5, "num_gpus": 0}
    assert cfg.resources("store") == {"num_cpus": 0, "num_gpus": 0}
    for bad in (["decode"], ["decode=-1"], ["boss=1"], ["decode=x"]):
        with pytest.raises(ValueError, match="--cpus: expected KIND=N"):
            parse_amounts(bad, "--cpus")
    with pytest.raises(ValueError, match="'boss' is none of"):
        RayDeployConfig(TOPOLOGIES["cpd-1d"], gpus={"boss": 1})
    with pytest.raises(ValueError, match="max-restarts"):
        RayDeployConfig(TOPOLOGIES["cpd-1d"], max_restarts=-2)


def test_argv_of_router_and_worker():
    a = build_parser().parse_args(["deploy", "--ray", "10.0.0.1:6379", "--topology", "cpd-1d", "--port", "8100",
                                   "--worker-args", "--threads 1 --kv-cache-gib 0.25"])
    cfg = config(a)
    assert router_argv(cfg) == ["--log-level", "WARNING", "router", "--host", "{host}", "--port", "8100",
                                "--route-policy", "cpd", "--ppd", "off", "--heartbeat-s", "1.0", "--drop-after-s", "3.0",
                                "--model", "smollm2"]
    kv = kv_store("10.0.0.1", cfg)
    assert kv == "10.0.0.1:50051,http://10.0.0.1:8080/metadata"
    assert worker_argv(cfg, "decode-0", "decode", "http://10.0.0.1:8100", kv) == [
        "--log-level", "WARNING", "worker", "--role", "decode", "--worker-id", "decode-0", "--host", "{host}",
        "--port", "0", "--router", "http://10.0.0.1:8100", "--kv-store", kv, "--heartbeat-s", "1.0",
        "--model", "smollm2", "--threads", "1", "--kv-cache-gib", "0.25"]
    assert segment_argv(cfg, kv) == ["--log-level", "WARNING", "store", "--host", "{host}", "--no-master",
                                     "--kv-store", kv]
    with pytest.raises(ValueError, match="store-segments must be >= 1"):
        RayDeployConfig(TOPOLOGIES["cpd-1d"], store_segments=0)


def test_the_cli_does_not_import_ray():
    code = ("import sys, warmpath.cli as c; p = c.build_parser(); p.parse_args(['deploy', '--ray', 'auto', '--down']);"
            "import warmpath.deploy.ray_deploy; print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_deploy_flags_errors():
    with pytest.raises(SystemExit):   # argparse: one of --topology / --status / --scale / --down
        build_parser().parse_args(["deploy", "--ray", "auto"])
    from warmpath.cli import main
    assert main(["deploy", "--ray", "auto", "--scale", "prefill"]) == 2
    assert main(["deploy", "--ray", "auto", "--topology", "nope"]) == 2

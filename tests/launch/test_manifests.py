"""``warmpath manifests``: every object valid against the Kubernetes schemas (1.30 and 1.37,
strict: unknown fields refused), offline; labels, probes, resources, PDBs and the drain
exactly; the flags the pods run parse with warmpath's own CLI; deploy/k8s/ is a fresh render;
bad input names itself."""

import re
import socket
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from warmpath.cli import build_parser, main
from warmpath.launch.manifests import ManifestConfig, render
from warmpath.launch.manifests_cli import texts
from warmpath.launch.topology import resolve

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("1.30", "1.37")     # the oldest we claim (the router's preStop sleep) and the newest schemas
ROLE = "warmpath/role"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def objects(cfg: ManifestConfig) -> list[dict]:
    return [o for objs in render(cfg).values() for o in objs]


def by(cfg: ManifestConfig, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects(cfg) if o["kind"] == kind}


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""
    def refuse(*a, **k):
        raise AssertionError(f"network used: {a}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("topo,gpus", [("cpd-1d", 0), ("replica-2", 0), ("pd-2p1d", 1), ("ppd-1p3d", 2)])
def test_every_rendered_object_is_valid_against_the_kubernetes_schemas_offline(topo, gpus, no_network):
    cfg = ManifestConfig(resolve(topo), gpus_per_worker=gpus)
    objs = [o for text in texts(cfg).values() for o in yaml.safe_load_all(text) if o["kind"] != "Kustomization"]
    assert len(objs) == len(objects(cfg)) >= 8
    for o in objs:
        for v in VERSIONS:
            assert kubernetes_validate.validate(o, v, strict=True) == v, o["metadata"]["name"]


def test_schema_check_catches_a_misspelt_field(no_network):
    dep = by(ManifestConfig(resolve("cpd-1d")), "Deployment")["warmpath-decode"]
    container(dep)["readinesProbe"] = container(dep).pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(dep, "1.37", strict=True)


def test_cpd_1d_has_a_deployment_and_a_pdb_per_role_with_role_labels():
    cfg = ManifestConfig(resolve("cpd-1d"))
    deps, pdbs = by(cfg, "Deployment"), by(cfg, "PodDisruptionBudget")
    assert sorted(deps) == ["warmpath-decode", "warmpath-pre-prefill", "warmpath-prefill", "warmpath-router",
                            "warmpath-store"]
    assert sorted(pdbs) == ["warmpath-decode", "warmpath-pre-prefill", "warmpath-prefill"]
    for role in ("pre-prefill", "prefill", "decode"):
        d, p = deps[f"warmpath-{role}"], pdbs[f"warmpath-{role}"]
        match = {"app.kubernetes.io/name": "warmpath", "app.kubernetes.io/component": "worker", ROLE: role}
        assert d["spec"]["selector"]["matchLabels"] == match == p["spec"]["selector"]["matchLabels"]
        assert d["spec"]["template"]["metadata"]["labels"] == {**match, "app.kubernetes.io/instance": "cpd-1d"}
        assert d["spec"]["replicas"] == 1
        assert p["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": match},
                             "unhealthyPodEvictionPolicy": "IfHealthyBudget"}
        assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    for name in ("warmpath-router", "warmpath-store"):   # one of each, never two at once
        assert deps[name]["spec"]["replicas"] == 1 and deps[name]["spec"]["strategy"] == {"type": "Recreate"}


def test_worker_probes_resources_secret_and_drain():
    cfg = ManifestConfig(resolve("cpd-1d"), drain_timeout_s=90)
    d = by(cfg, "Deployment")["warmpath-prefill"]
    c, pod = container(d), d["spec"]["template"]["spec"]

    def http(path, period, fails):
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
                "failureThreshold": fails}
    assert c["startupProbe"] == http("/health", 5, 120)
    assert c["livenessProbe"] == http("/health", 10, 3)
    assert c["readinessProbe"] == http("/ready", 5, 2)
    assert c["ports"] == [{"name": "http", "containerPort": 8001, "protocol": "TCP"}]
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert {"name": "WARMPATH_CLUSTER_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "warmpath-secrets", "key": "cluster-token"}}} in c["env"]
    assert "WARMPATH_API_KEY" not in {e["name"] for e in c["env"]}     # the router's alone
    assert pod["terminationGracePeriodSeconds"] == 120                  # the drain + 30 s
    args = c["args"]
    assert args[args.index("--drain-timeout-s") + 1] == "90" and args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--router") + 1] == "http://warmpath-router-workers:8000"
    assert "tolerations" not in pod and pod["automountServiceAccountToken"] is False


def test_gpu_workers_request_whole_gpus_and_run_on_cuda():
    cfg = ManifestConfig(resolve("pd-2p1d"), gpus_per_worker=2, cpus_per_worker=8)
    deps = by(cfg, "Deployment")
    assert deps["warmpath-prefill"]["spec"]["replicas"] == 2 and deps["warmpath-decode"]["spec"]["replicas"] == 1
    c = container(deps["warmpath-decode"])
    assert c["resources"] == {"requests": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": 2},
                              "limits": {"memory": "16Gi", "nvidia.com/gpu": 2}}
    assert c["args"][c["args"].index("--device") + 1] == "cuda" and c["args"][c["args"].index("--threads") + 1] == "8"
    assert deps["warmpath-decode"]["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for name in ("warmpath-router", "warmpath-store"):     # no GPU where none is used
        assert "nvidia.com/gpu" not in container(deps[name])["resources"]["limits"]


def test_router_services_secrets_and_probes():
    cfg = ManifestConfig(resolve("ppd-1p3d"))
    c = container(by(cfg, "Deployment")["warmpath-router"])
    assert c["args"] == ["router", "--host", "0.0.0.0", "--port", "8000", "--route-policy", "pd", "--ppd", "dynamic",
                         "--model", "smollm2"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in c["env"] if "valueFrom" in e} == {
        "WARMPATH_CLUSTER_TOKEN": "cluster-token", "WARMPATH_API_KEY": "api-keys"}
    svcs = by(cfg, "Service")
    assert svcs["warmpath-router"]["spec"].get("publishNotReadyAddresses") is None          # clients: ready only
    assert svcs["warmpath-router-workers"]["spec"]["publishNotReadyAddresses"] is True     # workers register first
    assert [p["port"] for p in svcs["warmpath-store"]["spec"]["ports"]] == [50051, 8080]


def test_selectors_pick_their_pods_and_names_are_dns_labels():
    """What the API server would check beyond the schemas: selectors match the pods they
    mean (Deployments, Services, PDBs), names and label values are DNS labels."""
    for topo in ("cpd-1d", "replica-2"):
        objs = objects(ManifestConfig(resolve(topo)))
        pods = [o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] == "Deployment"]
        for o in objs:
            assert DNS_LABEL.fullmatch(o["metadata"]["name"]), o["metadata"]["name"]
            for v in o["metadata"].get("labels", {}).values():
                assert DNS_LABEL.fullmatch(v), v
            sel = (o["spec"].get("selector") or {}) if o["kind"] != "Namespace" else {}
            sel = sel.get("matchLabels", sel) if o["kind"] != "Service" else sel
            if sel:
                hits = [p for p in pods if sel.items() <= p.items()]
                assert len(hits) == 1, (o["kind"], o["metadata"]["name"])


def test_the_flags_the_pods_run_are_warmpaths_own():
    cfg = ManifestConfig(resolve("cpd-1d"))
    for d in by(cfg, "Deployment").values():
        args = [a.replace("$(POD_IP)", "10.0.0.7").replace("$(POD_NAME)", "warmpath-decode-5d9c-x2x4z")
                for a in container(d)["args"]]
        a = build_parser().parse_args(args)
        assert a.cmd == args[0]
        if a.cmd == "worker":
            assert (a.worker_id, a.advertise_host, a.kv_store) == (
                "warmpath-decode-5d9c-x2x4z", "10.0.0.7", "warmpath-store:50051,http://warmpath-store:8080/metadata")


@pytest.mark.parametrize("topo", ["cpd-1d", "replica-2"])
def test_committed_manifests_are_a_fresh_render(topo, tmp_path):
    assert main(["manifests", "--topology", topo, "--out", str(tmp_path)]) == 0
    fresh = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in (REPO / "deploy/k8s" / topo).iterdir()}
    assert sorted(committed) == sorted(fresh)
    for name, text in fresh.items():
        assert committed[name] == text, f"deploy/k8s/{topo}/{name} differs from a fresh render"
    kust = yaml.safe_load(fresh["kustomization.yaml"])
    assert sorted(kust["resources"]) == sorted(set(fresh) - {"kustomization.yaml"})


@pytest.mark.parametrize("argv,message", [
    (["--topology", "nope"], "--topology: 'nope' is neither one of"),
    (["--topology", "cpd-1d", "--gpus-per-worker", "-1"], "--gpus-per-worker must be an integer >= 0, got -1"),
    (["--topology", "cpd-1d", "--cpus-per-worker", "0"], "--cpus-per-worker must be an integer >= 1, got 0"),
    (["--topology", "cpd-1d", "--namespace", "Prod_1"], "--namespace must be a DNS label"),
    (["--topology", "cpd-1d", "--store-gib", "0"], "--store-gib > 0"),
    (["--topology", "/nonexistent/t.json"], "no such file /nonexistent/t.json"),
])
def test_bad_input_is_a_cli_error_naming_it(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["manifests", *argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()     # nothing written


def test_a_vllm_topology_is_refused_by_name(tmp_path, capsys):
    t = tmp_path / "v.json"
    t.write_text('{"policy": "replica", "workers": {"replica": 2}, "engine": "vllm"}')
    assert main(["manifests", "--topology", str(t), "--out", str(tmp_path / "o")]) == 2
    assert "topology v: manifests run warmpath's engine only" in capsys.readouterr().err


def test_several_routers_are_a_stateful_set_of_peers_that_every_worker_reports_to(no_network):
    cfg = ManifestConfig(resolve("cpd-1d"), routers=3)
    objs = objects(cfg)
    for o in objs:
        for v in VERSIONS:
            assert kubernetes_validate.validate(o, v, strict=True) == v, o["metadata"]["name"]
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
    assert "warmpath-router" not in by(cfg, "Deployment")
    assert (sts["spec"]["replicas"], sts["spec"]["serviceName"]) == (3, "warmpath-router-peers")
    urls = [f"http://warmpath-router-{i}.warmpath-router-peers:8000" for i in range(3)]
    args = [a.replace("$(POD_NAME)", "warmpath-router-1") for a in container(sts)["args"]]
    a = build_parser().parse_args(args)
    assert a.peer == urls and a.advertise_url == urls[1]      # the router skips itself among its peers
    svcs = by(cfg, "Service")
    assert svcs["warmpath-router-peers"]["spec"]["clusterIP"] == "None"
    assert svcs["warmpath-router"]["spec"].get("publishNotReadyAddresses") is None
    assert "warmpath-router-workers" not in svcs and "warmpath-router" in by(cfg, "PodDisruptionBudget")
    for d in by(cfg, "Deployment").values():
        if container(d)["args"][0] == "worker":
            w = build_parser().parse_args(container(d)["args"])
            assert w.router == ",".join(urls)

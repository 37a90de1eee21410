"""Kubernetes manifests of a topology (pure): the store, the router and one Deployment per
worker role, as ``warmpath manifests`` writes them (``docs/deploy.md``, "Kubernetes").

* ``warmpath-store``: the Mooncake master + a segment (``warmpath store``), one pod, and
  its Service (master RPC, HTTP metadata).
* ``warmpath-router``: one pod (its registry, KV index and sessions are its own), the
  clients' Service (ready only once a complete path exists) and ``warmpath-router-workers``,
  the Service workers register through (published before the router is ready: it becomes
  ready only once they registered). With ``--routers N`` (N > 1): a StatefulSet of N
  routers, active-active (``routing/peers.py``), each a ``--peer`` of the others by its
  stable name under the headless Service ``warmpath-router-peers``; every worker reports to
  all of them by those names; the clients' Service spreads requests over the ready ones
  and a PodDisruptionBudget keeps all but one up.
* ``warmpath-<role>``: a Deployment per role of the topology, its pods labelled
  ``warmpath/role``, ``/health`` as startup and liveness probe, ``/ready`` as readiness,
  a PodDisruptionBudget (one pod at a time); SIGTERM drains (``worker/drain.py``) within
  ``terminationGracePeriodSeconds``.

The cluster token and the API keys come from a Secret the platform team creates; a
NetworkPolicy lets only warmpath's pods reach the store and the workers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from warmpath.launch import k8s_objects as k
from warmpath.launch.topology import Topology

DEFAULT_IMAGE = "warmpath:0.1.0"
ROUTER_PORT, WORKER_PORT, MASTER_PORT, METADATA_PORT = 8000, 8001, 50051, 8080
GRACE_MARGIN_S = 30      # after the drain: uvicorn's own shutdown (10 s) and the exit
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class ManifestConfig:
    """What ``warmpath manifests`` renders: a topology and how its pods are sized."""

    topology: Topology
    image: str = DEFAULT_IMAGE
    namespace: str = "warmpath"
    gpus_per_worker: int = 0           # 0: CPU workers (--device cpu); else nvidia.com/gpu each (--device cuda)
    cpus_per_worker: int = 2           # CPU request and the worker's --threads
    worker_memory_gib: float = 0.0     # 0: 4 GiB for a CPU worker, 16 GiB for a GPU worker
    store_gib: float = 2.0             # the store segment's memory (--segment-gib)
    model: str = "smollm2"
    secret: str = "warmpath-secrets"   # keys cluster-token (every pod) and api-keys (the router)
    drain_timeout_s: int = 120
    routers: int = 1                   # > 1: a StatefulSet of active-active routers

    def __post_init__(self) -> None:
        ints = {"--gpus-per-worker": (self.gpus_per_worker, 0), "--cpus-per-worker": (self.cpus_per_worker, 1),
                "--drain-timeout-s": (self.drain_timeout_s, 0), "--routers": (self.routers, 1)}
        for flag, (v, low) in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{flag} must be an integer >= {low}, got {v!r}")
        if not self.worker_memory_gib >= 0 or not self.store_gib > 0:
            raise ValueError(f"--worker-memory-gib must be >= 0 and --store-gib > 0, got "
                             f"{self.worker_memory_gib} / {self.store_gib}")
        for flag, v in (("--namespace", self.namespace), ("--secret", self.secret)):
            if not _DNS_LABEL.fullmatch(v):
                raise ValueError(f"{flag} must be a DNS label (lower-case letters, digits, '-'; at most 63), got {v!r}")
        if not self.image or any(c.isspace() for c in self.image):
            raise ValueError(f"--image must be an image reference without spaces, got {self.image!r}")
        if self.topology.engines:
            raise ValueError(f"topology {self.topology.name}: manifests run warmpath's engine only; "
                             f"the vLLM engine ({self.topology.engines}) is not supported here yet")

    @property
    def memory_gib(self) -> float:
        return self.worker_memory_gib or (16.0 if self.gpus_per_worker else 4.0)

    @property
    def grace_s(self) -> int:
        return self.drain_timeout_s + GRACE_MARGIN_S


def render(cfg: ManifestConfig) -> dict[str, list[dict]]:
    """File name → the objects it holds, in the order to apply them."""
    internal = k.internal_only(k.meta("warmpath-internal", cfg.namespace, {k.NAME_LABEL: "warmpath"}),
                               ["store", "worker"])
    files = {"namespace.yaml": [k.namespace(cfg.namespace)], "network-policy.yaml": [internal],
             "store.yaml": store(cfg), "router.yaml": router(cfg)}
    for wid_role in dict.fromkeys(role for _, role in cfg.topology.roles()):
        files[f"worker-{wid_role}.yaml"] = worker(cfg, wid_role)
    return files


def _labels(cfg: ManifestConfig, match: dict) -> dict:
    return {**match, k.INSTANCE_LABEL: instance(cfg.topology.name)}


def instance(name: str) -> str:
    """A topology's name as a label value (``pd-2p1d+pd-kv`` → ``pd-2p1d-pd-kv``)."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-") or "warmpath"


def _secret_env(cfg: ManifestConfig, router: bool = False) -> list[dict]:
    env = [k.env_secret("WARMPATH_CLUSTER_TOKEN", cfg.secret, "cluster-token")]
    return env + [k.env_secret("WARMPATH_API_KEY", cfg.secret, "api-keys")] if router else env


def store(cfg: ManifestConfig) -> list[dict]:
    """The Mooncake master + segment (one pod: workers find it by its Service's name)."""
    match = k.selector("store")
    labels = _labels(cfg, match)
    args = ["store", "--host", "$(POD_IP)", "--master-port", str(MASTER_PORT), "--metadata-port",
            str(METADATA_PORT), "--segment-gib", f"{cfg.store_gib:g}"]
    probes = {"startupProbe": k.tcp_probe("metadata", 2, 30), "livenessProbe": k.tcp_probe("metadata", 10, 3),
              "readinessProbe": k.tcp_probe("master", 5, 2)}
    c = k.container("store", cfg.image, args, {"master": MASTER_PORT, "metadata": METADATA_PORT},
                    [k.env_field("POD_IP", "status.podIP")], k.resources("1", cfg.store_gib + 1), probes)
    tpl = k.pod_template(labels, None, [c], 30)
    md = k.meta("warmpath-store", cfg.namespace, labels)
    return [k.deployment(md, match, 1, tpl, rolling=False),
            k.service(md, match, {"master": MASTER_PORT, "metadata": METADATA_PORT})]


PEERS = "warmpath-router-peers"


def router_urls(cfg: ManifestConfig) -> list[str]:
    """Each router pod's URL by its stable name (``--routers N`` > 1)."""
    return [f"http://warmpath-router-{i}.{PEERS}:{ROUTER_PORT}" for i in range(cfg.routers)]


def router(cfg: ManifestConfig) -> list[dict]:
    """The router's pod, the clients' Service and the workers' Service (several routers:
    :func:`routers`)."""
    if cfg.routers > 1:
        return routers(cfg)
    match = k.selector("router")
    labels = _labels(cfg, match)
    tpl = k.pod_template(labels, None, [_router_container(cfg, [], [])], cfg.grace_s)
    return [k.deployment(k.meta("warmpath-router", cfg.namespace, labels), match, 1, tpl, rolling=False),
            k.service(k.meta("warmpath-router", cfg.namespace, labels), match, {"http": ROUTER_PORT}),
            k.service(k.meta("warmpath-router-workers", cfg.namespace, labels), match, {"http": ROUTER_PORT},
                      publish_not_ready=True)]


def _router_container(cfg: ManifestConfig, extra: list[str], env: list[dict]) -> dict:
    t = cfg.topology
    args = ["router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--route-policy", t.policy,
            "--ppd", t.ppd, "--model", cfg.model, *extra]   # --elastic auto: on for cpd, as `warmpath serve` runs it
    probes = {"startupProbe": k.http_probe("/health", 2, 60), "livenessProbe": k.http_probe("/health", 10, 3),
              "readinessProbe": k.http_probe("/ready", 5, 2)}
    # preStop: the Service stops sending clients here before the router stops listening.
    return k.container("router", cfg.image, args, {"http": ROUTER_PORT}, [*env, *_secret_env(cfg, router=True)],
                       k.resources("1", 1, memory_limit_gib=2), probes, {"preStop": {"sleep": {"seconds": 5}}})


def routers(cfg: ManifestConfig) -> list[dict]:
    """N routers, active-active: a StatefulSet (stable names: each router lists all N as
    ``--peer`` and skips its own), the headless Service their names resolve under, the
    clients' Service over the ready ones, and a PDB. Elastic roles are decided by the first
    router alive (``RouterState.decides_roles``); the others follow the workers' heartbeats."""
    match = k.selector("router")
    labels = _labels(cfg, match)
    peers = [f for u in router_urls(cfg) for f in ("--peer", u)]
    extra = ["--advertise-url", f"http://$(POD_NAME).{PEERS}:{ROUTER_PORT}", *peers]
    c = _router_container(cfg, extra, [k.env_field("POD_NAME", "metadata.name")])
    tpl = k.pod_template(labels, match, [c], cfg.grace_s)
    md = k.meta("warmpath-router", cfg.namespace, labels)
    return [k.stateful_set(md, match, cfg.routers, tpl, PEERS),
            k.service(md, match, {"http": ROUTER_PORT}),
            k.service(k.meta(PEERS, cfg.namespace, labels), match, {"http": ROUTER_PORT},
                      publish_not_ready=True, headless=True),
            k.disruption_budget(md, match)]


def worker_args(cfg: ManifestConfig, role: str) -> list[str]:
    """``warmpath worker`` flags of one role's pods (the pod's name is its worker id)."""
    return ["worker", "--role", role, "--worker-id", "$(POD_NAME)", "--host", "0.0.0.0",
            "--advertise-host", "$(POD_IP)", "--port", str(WORKER_PORT),
            "--router", ",".join(router_urls(cfg)) if cfg.routers > 1 else f"http://warmpath-router-workers:{ROUTER_PORT}",
            "--kv-store", f"warmpath-store:{MASTER_PORT},http://warmpath-store:{METADATA_PORT}/metadata",
            "--model", cfg.model, "--device", "cuda" if cfg.gpus_per_worker else "cpu",
            "--threads", str(cfg.cpus_per_worker), "--drain-timeout-s", str(cfg.drain_timeout_s)]


def worker(cfg: ManifestConfig, role: str) -> list[dict]:
    """One role's Deployment (as many pods as the topology has workers of it) and its PDB."""
    match = k.selector("worker", role)
    labels = _labels(cfg, match)
    probes = {"startupProbe": k.http_probe("/health", 5, 120),     # loading the model: up to 10 min
              "livenessProbe": k.http_probe("/health", 10, 3), "readinessProbe": k.http_probe("/ready", 5, 2)}
    env = [k.env_field("POD_NAME", "metadata.name"), k.env_field("POD_IP", "status.podIP"), *_secret_env(cfg)]
    c = k.container("worker", cfg.image, worker_args(cfg, role), {"http": WORKER_PORT}, env,
                    k.resources(str(cfg.cpus_per_worker), cfg.memory_gib, cfg.gpus_per_worker), probes)
    tpl = k.pod_template(labels, match, [c], cfg.grace_s, gpu=cfg.gpus_per_worker > 0)
    md = k.meta(f"warmpath-{role}", cfg.namespace, labels)
    return [k.deployment(md, match, cfg.topology.workers[role], tpl, rolling=True), k.disruption_budget(md, match)]

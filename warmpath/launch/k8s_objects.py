"""Kubernetes objects as plain dicts (pure): the pieces ``manifests.py`` assembles into a
deployment of a topology. Field names and shapes are the Kubernetes API's (apps/v1,
core/v1, policy/v1); the tests check every rendered object against its schema."""

from __future__ import annotations

NAME_LABEL, COMPONENT_LABEL, INSTANCE_LABEL = "app.kubernetes.io/name", "app.kubernetes.io/component", \
    "app.kubernetes.io/instance"
ROLE_LABEL = "warmpath/role"     # a worker's role as started (elastic tiers may change it later)


def selector(component: str, role: str | None = None) -> dict:
    """The labels that pick one component's pods (for a worker: one role's)."""
    out = {NAME_LABEL: "warmpath", COMPONENT_LABEL: component}
    return {**out, ROLE_LABEL: role} if role else out


def meta(name: str, namespace: str, labels: dict) -> dict:
    return {"name": name, "namespace": namespace, "labels": labels}


def http_probe(path: str, period_s: int, failures: int, timeout_s: int = 5) -> dict:
    """A probe on the container's ``http`` port."""
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s,
            "timeoutSeconds": timeout_s, "failureThreshold": failures}


def tcp_probe(port: str, period_s: int, failures: int) -> dict:
    return {"tcpSocket": {"port": port}, "periodSeconds": period_s, "timeoutSeconds": 5, "failureThreshold": failures}


def env_field(name: str, path: str) -> dict:
    """An environment variable from the pod's own fields (downward API)."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def env_secret(name: str, secret: str, key: str) -> dict:
    """An environment variable from a Secret's key (the pod does not start without it)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def resources(cpu: str, memory_gib: float, gpus: int = 0, memory_limit_gib: float | None = None) -> dict:
    """CPU and memory requested (memory also the limit: no overcommit of the KV pools);
    ``gpus`` whole ``nvidia.com/gpu`` devices, requested and limited alike."""
    mem = f"{memory_gib:g}Gi"
    out = {"requests": {"cpu": cpu, "memory": mem},
           "limits": {"memory": f"{memory_limit_gib:g}Gi" if memory_limit_gib else mem}}
    if gpus:
        out["requests"]["nvidia.com/gpu"] = gpus
        out["limits"]["nvidia.com/gpu"] = gpus
    return out


def container(name: str, image: str, args: list[str], ports: dict[str, int], env: list[dict], res: dict,
              probes: dict, lifecycle: dict | None = None) -> dict:
    """One ``warmpath`` container: ``args`` after the ``warmpath`` command, named ``ports``,
    ``probes`` (``startupProbe`` / ``livenessProbe`` / ``readinessProbe``). The converted
    model is read from the image's cache (``warmpath prepare`` at build time), else made
    at start in the container's own layer."""
    out = {"name": name, "image": image, "command": ["warmpath"], "args": args,
           "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports.items()],
           "env": env, "resources": res, **probes,
           "securityContext": {"allowPrivilegeEscalation": False}}
    if lifecycle:
        out["lifecycle"] = lifecycle
    return out


def pod_template(labels: dict, spread: dict | None, containers: list[dict], grace_s: int,
                 gpu: bool = False) -> dict:
    """Pods without API credentials, spread over nodes when ``spread`` (the selector) is
    given; GPU pods tolerate the GPU nodes' taint."""
    spec = {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": grace_s,
            "containers": containers}
    if spread:
        spec["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                              "whenUnsatisfiable": "ScheduleAnyway",
                                              "labelSelector": {"matchLabels": spread}}]
    if gpu:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": labels}, "spec": spec}


def deployment(md: dict, match: dict, replicas: int, template: dict, rolling: bool) -> dict:
    """``rolling``: one new pod up and ready before an old one drains (workers); else the
    old pod goes first (``Recreate``: the router and the store must never run twice)."""
    strategy = ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
                if rolling else {"type": "Recreate"})
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": md,
            "spec": {"replicas": replicas, "selector": {"matchLabels": match}, "strategy": strategy,
                     "template": template}}


def stateful_set(md: dict, match: dict, replicas: int, template: dict, service_name: str) -> dict:
    """Pods with stable names (``NAME-0`` … ``NAME-(replicas-1)``, each resolvable as
    ``NAME-i.SERVICE``), started and replaced in parallel, updated one at a time."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": md,
            "spec": {"replicas": replicas, "serviceName": service_name, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": match}, "template": template,
                     "updateStrategy": {"type": "RollingUpdate"}}}


def service(md: dict, match: dict, ports: dict[str, int], publish_not_ready: bool = False,
            headless: bool = False) -> dict:
    """``headless``: no virtual IP, a DNS name per pod (a StatefulSet's ``serviceName``)."""
    spec = {"type": "ClusterIP", "selector": match,
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports.items()]}
    if headless:
        spec["clusterIP"] = "None"
    if publish_not_ready:
        spec["publishNotReadyAddresses"] = True
    return {"apiVersion": "v1", "kind": "Service", "metadata": md, "spec": spec}


def disruption_budget(md: dict, match: dict) -> dict:
    """At most one pod of the set evicted at a time (a node drain waits for its drain). A
    worker that is not ready may be only busy (its queue full), so not-ready pods are
    evicted only while the budget holds (``IfHealthyBudget``), not always."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": md,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": match},
                     "unhealthyPodEvictionPolicy": "IfHealthyBudget"}}


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {NAME_LABEL: "warmpath"}}}


def internal_only(md: dict, components: list[str]) -> dict:
    """A NetworkPolicy: the pods of ``components`` take connections only from warmpath's own
    pods (the store and the workers answer no one else; enforced where the network plugin
    enforces NetworkPolicies)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": md,
            "spec": {"podSelector": {"matchExpressions": [
                         {"key": NAME_LABEL, "operator": "In", "values": ["warmpath"]},
                         {"key": COMPONENT_LABEL, "operator": "In", "values": components}]},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {NAME_LABEL: "warmpath"}}}]}]}}

"""``warmpath deploy --ray ADDRESS``: the store, the router and every worker as detached Ray
actors (:class:`~warmpath.deploy.actor.ProcessHost`), each running the real process.

The store and the router stay on one node (the head unless told), so the addresses every
worker was given survive their restarts; workers spread over the nodes with their CPUs and
GPUs. Ray restarts an actor whose process died (``max_restarts``); a restarted worker
registers again under its id. ``--scale ROLE=N`` starts workers, or drains them through the
router (:mod:`warmpath.deploy.drain`) before stopping them. This is the only module that
imports Ray, and only when one of these functions runs.
"""

from __future__ import annotations

import time

import httpx

from warmpath.deploy import drain as drains
from warmpath.deploy.actor import ProcessHost
from warmpath.deploy.placement import (
    RayDeployConfig,
    actor_name,
    is_store,
    kv_store,
    proc_of,
    router_argv,
    scale_plan,
    segment_argv,
    store_argv,
    worker_argv,
)
from warmpath.protocol.auth import API_KEY_ENV, CLUSTER_TOKEN_ENV


def connect(address: str, namespace: str):
    """``ray.init`` on an existing cluster (``ADDRESS`` as ``ray start`` printed it)."""
    try:
        import ray
    except ImportError:
        raise ValueError("deploy --ray needs Ray: pip install -r requirements/ray.txt") from None
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, logging_level="ERROR", log_to_driver=False)
    return ray


def _node_id(ray, address: str | None) -> str:
    """The Ray node id of the node at ``address`` (``None``: the head node)."""
    for n in ray.nodes():
        if n["Alive"] and (n["NodeManagerAddress"] == address if address
                           else "node:__internal_head__" in n["Resources"]):
            return n["NodeID"]
    raise ValueError(f"no live Ray node at {address}" if address else "no live Ray head node")


def _start(ray, cfg: RayDeployConfig, kind: str, name: str, argv: list, env: dict, node: str | None = None,
           spec=None):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = NodeAffinitySchedulingStrategy(node, soft=False) if node else "SPREAD"
    return ray.remote(ProcessHost).options(
        name=actor_name(name), lifetime="detached", max_restarts=cfg.max_restarts, max_task_retries=-1,
        scheduling_strategy=where, **cfg.resources(kind)).remote(name, argv, env, spec)


def actors(ray) -> dict:
    """Process name → actor handle, of the deployment in this namespace."""
    return {p: ray.get_actor(n) for n in ray.util.list_named_actors() if (p := proc_of(n)) is not None}


def workers_registered(router_url: str, headers: dict) -> dict:
    """The router's ``/v1/cluster`` workers by id (empty while it does not answer)."""
    try:
        r = httpx.get(router_url + "/v1/cluster", headers=headers, timeout=5)
        return {w["worker_id"]: w for w in r.json()["workers"]}
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


def _wait(pred, timeout_s: float, what: str, tail=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(0.3)
    raise RuntimeError(f"{what}: not within {timeout_s:.0f} s" + (f"\n{tail()}" if tail else ""))


def up(address: str, cfg: RayDeployConfig, token: str, api_keys: tuple = (), timeout_s: float = 300.0) -> dict:
    """Start a deployment; returns ``{"router": URL, "kv_store": ..., "workers": [ids]}`` once
    every worker registered (``RuntimeError`` otherwise; what started keeps running for
    ``--status`` and ``--down``)."""
    ray = connect(address, cfg.namespace)
    if actors(ray):
        raise ValueError(f"a deployment runs in Ray namespace {cfg.namespace!r}: --down it first")
    env = {CLUSTER_TOKEN_ENV: token}
    store = _start(ray, cfg, "store", "store", store_argv(cfg), env, _node_id(ray, cfg.store_node))
    if not ray.get(store.wait_output.remote("--kv-store", 120)):
        raise RuntimeError("the store did not start:\n" + ray.get(store.log_tail.remote()))
    kv = kv_store(ray.get(store.info.remote())["host"], cfg)
    _segments(ray, cfg, kv, env)
    router = _start(ray, cfg, "router", "router", router_argv(cfg),
                    {**env, API_KEY_ENV: ",".join(api_keys)}, _node_id(ray, cfg.router_node), spec=cfg)
    url = f"http://{ray.get(router.info.remote())['host']}:{cfg.router_port}"
    headers = {"Authorization": f"Bearer {api_keys[0] if api_keys else token}"}
    for wid, role in cfg.topology.roles():
        _start(ray, cfg, role, wid, worker_argv(cfg, wid, role, url, kv), env)
    want = {w for w, _ in cfg.topology.roles()}
    _wait(lambda: want <= set(workers_registered(url, headers)), timeout_s, "every worker registered",
          lambda: ray.get(router.log_tail.remote()))
    return {"router": url, "kv_store": kv, "workers": sorted(want)}


def _segments(ray, cfg: RayDeployConfig, kv: str, env: dict) -> None:
    """``store_segments - 1`` more segments, each on its own node other than the master's."""
    if cfg.store_segments == 1:
        return
    master = _node_id(ray, cfg.store_node)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != master]
    if len(nodes) < cfg.store_segments - 1:
        raise ValueError(f"--store-segments {cfg.store_segments}: only {len(nodes) + 1} live node(s), "
                         "one segment per node")
    for i, node in enumerate(nodes[:cfg.store_segments - 1], start=1):
        seg = _start(ray, cfg, "store", f"store-{i}", segment_argv(cfg, kv), env, node)
        if not ray.get(seg.wait_output.remote("segment on", 120)):
            raise RuntimeError(f"store segment {i} did not start:\n" + ray.get(seg.log_tail.remote()))


def _context(ray) -> tuple:
    """The running deployment's actors, config, router URL, kv-store, cluster token, and the
    headers of ``/internal/*`` (the token) and of ``/v1/cluster`` (an API key, if any)."""
    acts = actors(ray)
    if "router" not in acts or "store" not in acts:
        raise ValueError("no deployment runs in this Ray namespace (deploy one with --topology)")
    router = acts["router"]
    cfg = ray.get(router.spec.remote())
    url = f"http://{ray.get(router.info.remote())['host']}:{cfg.router_port}"
    token = ray.get(router.secret.remote(CLUSTER_TOKEN_ENV))
    key = (ray.get(router.secret.remote(API_KEY_ENV)) or token).split(",")[0]
    kv = kv_store(ray.get(acts["store"].info.remote())["host"], cfg)
    return acts, cfg, url, kv, token, {"Authorization": f"Bearer {token}"}, {"Authorization": f"Bearer {key}"}


def status(address: str, namespace: str) -> dict:
    """Every process: its node, PID, whether Ray restarted it; each worker's role, draining
    flag and in-flight count as the router sees them."""
    ray = connect(address, namespace)
    acts, cfg, url, _kv, _token, _internal, public = _context(ray)
    seen = workers_registered(url, public)
    out = {"router": url, "topology": cfg.topology.name, "processes": {}}
    for name, a in sorted(acts.items()):
        try:
            info = ray.get(a.info.remote(), timeout=10)
        except Exception as e:  # noqa: BLE001 - a restarting actor answers nothing yet
            info = {"state": f"not answering ({type(e).__name__})"}
        if name in seen:
            info.update({k: seen[name][k] for k in ("role", "draining", "in_flight")}, registered=True)
        elif name != "router" and not is_store(name):
            info["registered"] = False
        out["processes"][name] = info
    return out


def scale(address: str, namespace: str, role: str, count: int, timeout_s: float = 300.0,
          drain_timeout_s: float = 300.0) -> dict:
    """``count`` workers of ``role`` (by the role they started with): new ones start and
    register; extra ones are drained (nothing new routed to them, what they have runs to its
    end), stopped, and removed. Returns ``{"started": [...], "stopped": {id: drain seconds}}``."""
    ray = connect(address, namespace)
    acts, cfg, url, kv, token, internal, public = _context(ray)
    running = [p for p in acts if p != "router" and not is_store(p)]
    add, remove = scale_plan(running, role, count)
    for wid in add:
        _start(ray, cfg, role, wid, worker_argv(cfg, wid, role, url, kv), {CLUSTER_TOKEN_ENV: token})
    if add:
        _wait(lambda: set(add) <= set(workers_registered(url, public)), timeout_s, f"{', '.join(add)} registered")
    stopped = {}
    for wid in remove:
        stopped[wid] = round(drains.drain(url, wid, internal, drain_timeout_s), 2)
        retire(ray, acts[wid])
        drains.post(url, wid, "remove", internal)
    return {"started": add, "stopped": stopped}


def retire(ray, actor) -> None:
    """Stop an actor's process (SIGTERM first), then the actor, for good (no restart)."""
    try:
        ray.get(actor.stop.remote(), timeout=60)
    finally:
        ray.kill(actor, no_restart=True)


def down(address: str, namespace: str) -> list[str]:
    """Stop the deployment: workers first (each told to finish), then the router, then the
    store. Returns the process names stopped."""
    ray = connect(address, namespace)
    acts = actors(ray)
    order = sorted(acts, key=lambda p: (is_store(p), p == "store", p == "router", p))
    for name in order:
        try:
            retire(ray, acts[name])
        except Exception:  # noqa: BLE001 - a dead or restarting actor: killing it is enough
            ray.kill(acts[name], no_restart=True)
    return order


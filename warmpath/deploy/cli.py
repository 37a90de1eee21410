"""``warmpath deploy --ray ADDRESS``: ``--topology T`` starts a deployment on a running Ray
cluster, ``--status`` shows it, ``--scale ROLE=N`` grows or drains a role, ``--down`` stops
it (``docs/deploy.md``, "Ray"). Ray is imported only once one of these runs."""

from __future__ import annotations

import argparse
import json
import secrets

from warmpath.deploy.placement import RayDeployConfig, args, parse_amounts


def add_parser(sub) -> None:
    p = sub.add_parser("deploy", help="run a topology on a cluster manager (Ray): start, status, scale, stop")
    p.add_argument("--ray", required=True, metavar="ADDRESS", help="the Ray cluster (HOST:PORT of its head, or auto)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--topology", help="start this topology (a name or a .json file, as serve --topology)")
    what.add_argument("--status", action="store_true", help="show every process, its node and state")
    what.add_argument("--scale", metavar="ROLE=N", help="run N workers of ROLE: start new ones, or drain and stop")
    what.add_argument("--down", action="store_true", help="stop the deployment (workers first)")
    p.add_argument("--namespace", default="warmpath", help="Ray namespace of the deployment's actors")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--port", type=int, default=8000, help="the router's port")
    p.add_argument("--master-port", type=int, default=50051)
    p.add_argument("--metadata-port", type=int, default=8080)
    p.add_argument("--cpus", action="append", metavar="KIND=N",
                   help="Ray CPUs of a process kind: store, router or a role (default: 1 per worker, 0 else)")
    p.add_argument("--gpus", action="append", metavar="KIND=N", help="Ray GPUs of a process kind (default 0)")
    p.add_argument("--max-restarts", type=int, default=-1, help="Ray restarts of an actor whose process died (-1: always)")
    p.add_argument("--router-node", default=None, metavar="ADDR", help="node the router stays on (default: the head)")
    p.add_argument("--store-node", default=None, metavar="ADDR", help="node the store stays on (default: the head)")
    p.add_argument("--store-segments", type=int, default=1,
                   help="store segments, one per node: the master's own plus one on each of N-1 other nodes")
    p.add_argument("--heartbeat-s", type=float, default=1.0)
    p.add_argument("--drop-after-s", type=float, default=3.0)
    p.add_argument("--worker-args", default="", metavar="FLAGS", help="more `warmpath worker` flags (one quoted string)")
    p.add_argument("--router-args", default="", metavar="FLAGS", help="more `warmpath router` flags")
    p.add_argument("--store-args", default="", metavar="FLAGS", help="more `warmpath store` flags")
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long workers may take to register")
    p.add_argument("--drain-timeout-s", type=float, default=300.0, help="how long a drain may wait")
    p.add_argument("--cluster-token", default=None, metavar="SECRET",
                   help="the processes' shared secret (default: $WARMPATH_CLUSTER_TOKEN, else a random one)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY", help="API key of the router (repeatable)")
    p.set_defaults(fn=run_deploy)


def config(a: argparse.Namespace) -> RayDeployConfig:
    """The deploy config of ``--topology`` and the flags beside it."""
    from warmpath.launch.topology import resolve

    return RayDeployConfig(resolve(a.topology), a.namespace, a.port, a.master_port, a.metadata_port,
                           parse_amounts(a.cpus, "--cpus"), parse_amounts(a.gpus, "--gpus"), a.max_restarts,
                           a.heartbeat_s, a.drop_after_s, a.store_node, a.router_node, args(a.worker_args),
                           args(a.router_args), args(a.store_args), model=a.model,
                           store_segments=a.store_segments)


def run_deploy(a: argparse.Namespace) -> int:
    from warmpath.deploy import ray_deploy
    from warmpath.protocol.auth import api_keys, cluster_token

    if a.topology:
        cfg = config(a)
        out = ray_deploy.up(a.ray, cfg, cluster_token(a.cluster_token) or secrets.token_urlsafe(32),
                            api_keys(a.api_key), a.timeout_s)
        print(f"warmpath deploy: {cfg.topology.name} on Ray {a.ray}: serving on {out['router']}/v1\n"
              f"  workers: {', '.join(out['workers'])}; store: --kv-store {out['kv_store']}\n"
              f"  status: warmpath deploy --ray {a.ray} --status   stop: warmpath deploy --ray {a.ray} --down",
              flush=True)
    elif a.status:
        print(json.dumps(ray_deploy.status(a.ray, a.namespace), indent=1))
    elif a.scale:
        role, sep, n = a.scale.partition("=")
        if not sep or not n.strip().isdigit():
            raise ValueError(f"--scale: expected ROLE=N (e.g. prefill=2), got {a.scale!r}")
        print(json.dumps(ray_deploy.scale(a.ray, a.namespace, role.strip(), int(n), a.timeout_s,
                                          a.drain_timeout_s)))
    else:
        print("warmpath deploy: stopped " + ", ".join(ray_deploy.down(a.ray, a.namespace)))
    return 0

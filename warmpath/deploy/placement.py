"""What ``warmpath deploy --ray`` places (pure, no Ray): one process per actor, its name,
its resources and the ``warmpath`` command it runs; and which workers a scale adds or drains.

Every actor runs one real ``warmpath`` process (``store``, ``router`` or ``worker``). Its
argv may hold ``{host}``, replaced on the node by that node's address (what it binds and
announces), so an actor restarted on another node announces the right one.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from warmpath.launch.topology import Topology
from warmpath.routing.views import ROLES

PREFIX = "warmpath:"            # every actor of a deployment is named PREFIX + its process name
PROCS = ("store", "router", *ROLES)
HOST = "{host}"


@dataclass(frozen=True)
class RayDeployConfig:
    """``warmpath deploy --ray`` flags: where, what, and how much of a node each process takes.

    ``cpus`` / ``gpus``: process kind (``store``, ``router`` or a role) → Ray resources of its
    actor. ``max_restarts``: Ray restarts an actor whose process exits this many times (-1:
    always). ``store_node`` / ``router_node``: the node address the store and the router stay on
    (``None``: the head node), so their addresses survive a restart. ``store_segments``: the
    master's own segment plus one more on each of ``store_segments - 1`` other nodes."""

    topology: Topology
    namespace: str = "warmpath"
    router_port: int = 8000
    master_port: int = 50051
    metadata_port: int = 8080
    cpus: dict = field(default_factory=dict)
    gpus: dict = field(default_factory=dict)
    max_restarts: int = -1
    heartbeat_s: float = 1.0
    drop_after_s: float = 3.0
    store_node: str | None = None
    router_node: str | None = None
    worker_args: tuple = ()
    router_args: tuple = ()
    store_args: tuple = ()
    log_level: str = "WARNING"
    model: str = "smollm2"
    store_segments: int = 1

    def __post_init__(self) -> None:
        for what, table in (("cpus", self.cpus), ("gpus", self.gpus)):
            for k, v in table.items():
                if k not in PROCS:
                    raise ValueError(f"--{what} {k}=...: {k!r} is none of {', '.join(PROCS)}")
                if not isinstance(v, (int, float)) or v < 0:
                    raise ValueError(f"--{what} {k}: expected a number >= 0, got {v!r}")
        if self.store_segments < 1:
            raise ValueError(f"--store-segments must be >= 1 (the master's own), got {self.store_segments}")
        if self.max_restarts < -1:
            raise ValueError(f"--max-restarts must be -1 (always) or >= 0, got {self.max_restarts}")
        for port in (self.router_port, self.master_port, self.metadata_port):
            if not 0 < port < 65536:
                raise ValueError(f"port {port} is not in 1-65535")

    def resources(self, kind: str) -> dict:
        """Ray actor options of a process kind: ``num_cpus`` (default 1 for a worker, else 0)
        and ``num_gpus`` (default 0)."""
        return {"num_cpus": self.cpus.get(kind, 1 if kind in ROLES else 0), "num_gpus": self.gpus.get(kind, 0)}


def parse_amounts(items: list[str] | None, flag: str) -> dict:
    """``["prefill=2", "router=0.5"]`` → ``{"prefill": 2.0, "router": 0.5}`` (a CLI error otherwise)."""
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value) if sep else float("nan")
        except ValueError:
            pass
        if not sep or name.strip() not in PROCS or not out.get(name.strip(), -1) >= 0:
            raise ValueError(f"{flag}: expected KIND=N with KIND one of {', '.join(PROCS)} and N >= 0, got {item!r}")
    return out


def args(text: str | None) -> tuple:
    """A shell-quoted flag string (``--worker-args "--threads 1"``) as argv items."""
    return tuple(shlex.split(text or ""))


def store_argv(cfg: RayDeployConfig) -> list[str]:
    return ["--log-level", cfg.log_level, "store", "--host", HOST, "--master-port", str(cfg.master_port),
            "--metadata-port", str(cfg.metadata_port), *cfg.store_args]


def segment_argv(cfg: RayDeployConfig, store: str) -> list[str]:
    """A store segment lending memory to the master of ``store`` (``--kv-store``)."""
    return ["--log-level", cfg.log_level, "store", "--host", HOST, "--no-master", "--kv-store", store, *cfg.store_args]


def is_store(proc: str) -> bool:
    """``store`` (the master and its segment) or ``store-N`` (a segment on another node)."""
    return proc == "store" or re.fullmatch(r"store-\d+", proc) is not None


def kv_store(host: str, cfg: RayDeployConfig) -> str:
    """The ``--kv-store`` of the store actor running on ``host``."""
    return f"{host}:{cfg.master_port},http://{host}:{cfg.metadata_port}/metadata"


def router_argv(cfg: RayDeployConfig) -> list[str]:
    t = cfg.topology
    return ["--log-level", cfg.log_level, "router", "--host", HOST, "--port", str(cfg.router_port),
            "--route-policy", t.policy, "--ppd", t.ppd, "--heartbeat-s", str(cfg.heartbeat_s),
            "--drop-after-s", str(cfg.drop_after_s), "--model", cfg.model, *cfg.router_args]


def worker_argv(cfg: RayDeployConfig, worker_id: str, role: str, router_url: str, store: str) -> list[str]:
    engine = ["--engine", cfg.topology.engines[role]] if role in cfg.topology.engines else []
    return ["--log-level", cfg.log_level, "worker", "--role", role, "--worker-id", worker_id, "--host", HOST,
            "--port", "0", "--router", router_url, "--kv-store", store, "--heartbeat-s", str(cfg.heartbeat_s),
            "--model", cfg.model, *engine, *cfg.worker_args]


def actor_name(proc: str) -> str:
    return PREFIX + proc


def proc_of(name: str) -> str | None:
    """The process name of a deployment's actor name (``None`` for another actor)."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else None


def role_of(worker_id: str) -> str:
    """``prefill-1`` → ``prefill`` (a ``ValueError`` for a name no deploy gives)."""
    m = re.fullmatch(r"(.+)-(\d+)", worker_id)
    if not m or m.group(1) not in ROLES:
        raise ValueError(f"{worker_id!r} is not a worker of a deployment (ROLE-N)")
    return m.group(1)


def scale_plan(running: list[str], role: str, count: int) -> tuple[list[str], list[str]]:
    """Workers to start and to drain for ``count`` workers of ``role``, given the ids of the
    workers running (any roles): new ones take the lowest free numbers, the highest numbers
    go first."""
    if role not in ROLES:
        raise ValueError(f"--scale: {role!r} is not a role; roles are {', '.join(ROLES)}")
    if count < 0:
        raise ValueError(f"--scale {role}: expected a count >= 0, got {count}")
    have = sorted(int(w.rsplit("-", 1)[1]) for w in running if role_of(w) == role)
    if count <= len(have):
        return [], [f"{role}-{i}" for i in sorted(have, reverse=True)[:len(have) - count]]
    free = (i for i in range(len(have) + count) if i not in have)
    return [f"{role}-{next(free)}" for _ in range(count - len(have))], []

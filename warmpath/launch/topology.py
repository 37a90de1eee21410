"""Named deployments: which worker roles, how many of each, which policy and PPD mode, and
optionally which CPUs each process is pinned to (pure)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from warmpath.routing.ppd import MODES as PPD_MODES
from warmpath.routing.views import ROLES

log = logging.getLogger(__name__)

ENGINES = ("warmpath", "vllm")


@dataclass(frozen=True)
class Topology:
    """``workers``: role → count. ``ppd``: ``off`` (turn 2+ like turn 1) or a PPD mode.
    ``cpus``: process → CPU list (``"0"``, ``"0-1,3"``), a process being a worker id
    (``prefill-0``), a role (all its workers) or ``router``; a worker id wins over its role.
    The launcher pins each process there and a pinned worker's ``--threads`` defaults to its
    CPU count (:func:`pinning`).

    ``engines``: role → ``warmpath`` | ``vllm`` (roles left out run ``serve --engine``'s)."""

    name: str
    policy: str
    workers: dict = field(default_factory=dict)
    ppd: str = "off"
    cpus: dict = field(default_factory=dict)
    engines: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from warmpath.routing.policy import POLICIES

        if self.policy not in POLICIES:
            raise ValueError(f"topology {self.name}: policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if self.ppd not in PPD_MODES:
            raise ValueError(f"topology {self.name}: ppd must be one of {PPD_MODES}, got {self.ppd!r}")
        bad = set(self.workers) - set(ROLES)
        if bad:
            raise ValueError(f"topology {self.name}: unknown roles {sorted(bad)}; roles are {ROLES}")
        if any(not isinstance(n, int) or n < 0 for n in self.workers.values()) or not any(self.workers.values()):
            raise ValueError(f"topology {self.name}: worker counts must be integers >= 0, at least one > 0")
        if set(self.engines) - set(ROLES) or set(self.engines.values()) - set(ENGINES):
            raise ValueError(f"topology {self.name}: engines must map roles {ROLES} to {ENGINES}, got {self.engines}")
        has = {r for r, n in self.workers.items() if n}
        if self.policy == "replica" and has != {"replica"}:
            raise ValueError(f"topology {self.name}: the replica policy needs only replica workers")
        if self.policy in ("cpd", "pd", "pd-kv") and ("decode" not in has or not has & {"prefill", "pre-prefill"}
                                                     or "replica" in has):
            raise ValueError(f"topology {self.name}: {self.policy} needs prefill-type and decode workers")
        if self.policy == "goodput" and not has & {"decode", "replica"}:
            raise ValueError(f"topology {self.name}: goodput needs decode workers or replicas (where answers decode)")
        known = {"router", *has, *(w for w, _ in self.roles())}
        for key, spec in self.cpus.items():
            if key not in known:
                raise ValueError(f"topology {self.name}: cpus names {key!r}, which is none of its processes "
                                 f"({', '.join(sorted(known))})")
            parse_cpus(spec, f"topology {self.name}: cpus of {key}")

    def engine_of(self, role: str, default: str = "warmpath") -> str:
        """The engine ``role``'s workers run (``default``: ``serve --engine``)."""
        return self.engines.get(role, default)

    def check_handoff(self, default: str = "warmpath", kv_connector: str | None = None) -> None:
        """``ValueError`` when the P/D roles present cannot hand off: they run two engines
        (warmpath's hand-off goes through its L3 store, vLLM's through vLLM's KV connector, and
        neither reads the other's KV), or vLLM without ``--vllm-kv-connector``."""
        pd = {r: self.engine_of(r, default) for r in ("pre-prefill", "prefill", "decode") if self.workers.get(r)}
        if len(set(pd.values())) > 1:
            raise ValueError(f"topology {self.name}: its P/D roles run different engines ({pd}); a hand-off "
                             "never crosses engines: give prefill-type and decode workers the same engine")
        if "vllm" in pd.values() and not kv_connector:
            raise ValueError(f"topology {self.name}: vLLM prefill / decode workers need --vllm-kv-connector "
                             "(nixl, mooncake or a JSON kv-transfer-config): vLLM hands off through it")

    def roles(self) -> list[tuple[str, str]]:
        """``(worker_id, role)`` for every worker, e.g. ``("prefill-0", "prefill")``."""
        return [(f"{r}-{i}", r) for r in ROLES for i in range(self.workers.get(r, 0))]

    @property
    def size(self) -> int:
        return sum(self.workers.values())


TOPOLOGIES = {t.name: t for t in (
    Topology("replica", "replica", {"replica": 2}),
    Topology("replica-2", "replica", {"replica": 2}),
    Topology("replica-3", "replica", {"replica": 3}),
    Topology("pd-2p1d", "pd", {"prefill": 2, "decode": 1}),
    Topology("pd-2p2d", "pd", {"prefill": 2, "decode": 2}),
    Topology("cpd-1d", "cpd", {"pre-prefill": 1, "prefill": 1, "decode": 1}),
    Topology("cpd-2d", "cpd", {"pre-prefill": 1, "prefill": 1, "decode": 2}),
    Topology("ppd-1p3d", "pd", {"prefill": 1, "decode": 3}, "dynamic"),
    Topology("ppd-2p2d", "pd", {"prefill": 2, "decode": 2}, "dynamic"),
    Topology("ppd-3p1d", "pd", {"prefill": 3, "decode": 1}, "dynamic"),
)}


def parse_cpus(spec, what: str = "cpus") -> frozenset[int]:
    """``"0-2,5"`` (or a list of ints / an int) → {0, 1, 2, 5}; empty or malformed raises."""
    items = spec if isinstance(spec, (list, tuple)) else [spec] if isinstance(spec, int) else str(spec).split(",")
    out: set[int] = set()
    try:
        for part in items:
            lo, _, hi = str(part).strip().partition("-")
            a, b = int(lo), int(hi or lo)
            if a < 0 or b < a:
                raise ValueError
            out.update(range(a, b + 1))
    except ValueError:
        raise ValueError(f"{what}: expected CPU numbers like 0 or 0-1,3, got {spec!r}") from None
    if not out:
        raise ValueError(f"{what}: no CPU given")
    return frozenset(out)


def pinning(topo: Topology, available=None) -> dict[str, frozenset[int]]:
    """Process name (``router``, each worker id) → its CPUs, from ``topo.cpus`` (a worker id
    over its role); every CPU must be one this process may run on (``available``, default
    ``os.sched_getaffinity(0)``), else a ``ValueError`` naming it."""
    avail = set(os.sched_getaffinity(0) if available is None else available)
    out = {}
    for name, role in [("router", "router"), *topo.roles()]:
        spec = topo.cpus.get(name, topo.cpus.get(role))
        if spec is None:
            continue
        cpus = parse_cpus(spec, f"topology {topo.name}: cpus of {name}")
        missing = sorted(cpus - avail)
        if missing:
            raise ValueError(f"topology {topo.name}: {name} is pinned to CPU {', '.join(map(str, missing))}, "
                             f"not available here (available: {', '.join(map(str, sorted(avail)))})")
        out[name] = cpus
    return out


def with_pins(topo: Topology, pins: list[str] | None) -> Topology:
    """``--pin NAME=CPUS`` items (``decode-0=1``, ``prefill=0-1``) over the topology's ``cpus``."""
    extra = {}
    for item in pins or []:
        name, sep, cpus = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--pin: expected NAME=CPUS (e.g. decode-0=1), got {item!r}")
        extra[name.strip()] = cpus.strip()
    return replace(topo, cpus={**topo.cpus, **extra}) if extra else topo


def spread_pins(topo: Topology, names: list[str], available=None) -> Topology:
    """Give each of ``names`` (workers whose engine binds its own OpenMP threads to every CPU it
    may use: vLLM) that no pin names a disjoint share, consecutive in CPU order, of the CPUs no
    worker pin holds (``available``, default ``os.sched_getaffinity(0)``); the first
    ``len(free) % len(names)`` get one CPU more. Two vLLM servers left on the same CPUs each
    bind a team of ``len(CPUs)`` spinning threads there and starve each other (a P/D pair on
    2 cores decoded at ~11 s per token, pinned at ~0.05 s). Unchanged when fewer free CPUs
    than such workers are left."""
    avail = sorted(os.sched_getaffinity(0) if available is None else available)
    pinned = pinning(topo, avail)
    todo = [n for n in names if n not in pinned]
    taken = set().union(*[pinned[n] for n in pinned if n != "router"]) if pinned else set()
    free = [c for c in avail if c not in taken]
    if not todo or len(free) < len(todo):
        return topo
    per, extra = divmod(len(free), len(todo))
    cpus, at = dict(topo.cpus), 0
    for i, name in enumerate(todo):
        n = per + (i < extra)
        cpus[name] = ",".join(map(str, free[at:at + n]))
        at += n
    return replace(topo, cpus=cpus)


def spread_vllm(topo: Topology, engine: str) -> Topology:
    """``topo`` with its unpinned vLLM workers each pinned to a share of the free CPUs
    (``topology.spread_pins``), said in the log; a warning when too few CPUs are left for that."""
    names = [wid for wid, role in topo.roles() if topo.engines.get(role, engine) == "vllm"]
    out = spread_pins(topo, names)
    if out is not topo:
        log.warning("vLLM workers pinned to their own CPUs (--pin NAME=CPUS or --vllm-cpus to choose): %s",
                    ", ".join(f"{n}={out.cpus[n]}" for n in names if n not in topo.cpus))
    elif len([n for n in names if n not in pinning(topo)]) > 1:
        log.warning("%d vLLM workers share CPUs: each binds an OpenMP team to all of them (slow); "
                    "pin them with --pin NAME=CPUS", len(names))
    return out


def resolve(spec: str, ppd: str | None = None, policy: str | None = None) -> Topology:
    """A topology name, or a JSON file ``{"policy": ..., "ppd": ..., "workers": {role: n},
    "engine": "vllm"}`` (or ``"engines": {role: engine}``);
    ``ppd`` and ``policy`` override its PPD mode and routing policy (e.g. ``pd-2p1d`` with
    ``pd-kv``: the same workers under the KV-aware baseline)."""
    if spec in TOPOLOGIES:
        t = TOPOLOGIES[spec]
    elif spec.endswith(".json"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--topology: no such file {spec}")
        try:
            d = json.loads(path.read_text())
            engines = d.get("engines", {})
            if "engine" in d:   # one engine for every role
                engines = {r: d["engine"] for r in d["workers"]} | dict(engines)
            t = Topology(path.stem, d.get("policy", "cpd"), dict(d["workers"]), d.get("ppd", "off"),
                         dict(d.get("cpus", {})), dict(engines))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"--topology {spec}: expected {{\"policy\", \"ppd\", \"workers\": "
                             f"{{role: count}}, \"cpus\": {{process: cpus}}, \"engine\" or \"engines\": "
                             f"{{role: engine}} (both optional)}}: {e}") from e
    else:
        raise ValueError(f"--topology: {spec!r} is neither one of {sorted(TOPOLOGIES)} nor a .json file")
    t = replace(t, ppd=ppd) if ppd else t
    return replace(t, name=f"{t.name}+{policy}", policy=policy) if policy and policy != t.policy else t

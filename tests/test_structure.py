"""The architecture as rules: layers import downwards only, no module or layer imports itself
back through others (function-local and type-only imports included), and every routing
decision is made in one place (routing/route.py) that the router and the simulator both call."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "warmpath"

BASE = {"stats", "procs", "slo"}     # leaf modules any layer may use
# layer (a package, or a module at the root) -> the layers it may import (besides itself and BASE)
ALLOWED = {
    "stats": set(), "procs": set(), "slo": set(), "models": set(), "protocol": set(),
    "kv": {"procs"},
    "engine": {"kv", "models"},
    # the decision and its bookkeeping, pure: router/ (the process) and sim/ both drive it
    "routing": {"kv", "protocol"},
    "router": {"kv", "models", "protocol", "routing"},
    "worker": {"engine", "kv", "models", "protocol"},
    "bench": {"models", "protocol"},
    "launch": {"kv", "procs", "protocol", "routing"},
    # warmpath deploy --ray: the launch's topologies as Ray actors (Ray imported lazily, only there)
    "deploy": {"launch", "procs", "protocol", "routing"},
    "sim": {"bench", "engine", "kv", "launch", "routing"},
    "plan": {"bench", "engine", "launch", "routing", "sim"},
    # the flags of serve / worker and the configs built from them
    # (the --engine vllm flags live with the vLLM worker: warmpath/vllm/cli_flags.py)
    "cli_args": {"engine", "kv", "launch", "models", "routing", "vllm"},
    # the served phase starts a topology as `warmpath serve` does (cli_args) and drives it with the bench
    # --engine vllm starts a vLLM server as its worker kind does and reads its /metrics (vllm)
    "calibrate": {"bench", "cli_args", "engine", "kv", "launch", "models", "routing", "vllm"},
    "cli": {"bench", "calibrate", "cli_args", "deploy", "engine", "kv", "launch", "models", "plan", "protocol", "router",
            "routing", "sim", "vllm", "worker"},
    "cli_reference": {"cli"},
    # a vLLM server behind the router: its HTTP face, registration (torch-free) and events
    "vllm": {"kv", "launch", "models", "protocol", "worker"},
}


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = (root.name,) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path = ROOT) -> dict[str, tuple[Path, ast.Module]]:
    """Every module of warmpath/ (or of the package at ``root``) by dotted name (a package by its ``__init__``)."""
    return {_module_name(p, root): (p, ast.parse(p.read_text())) for p in sorted(root.rglob("*.py"))}


def _imported(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The warmpath modules ``name`` imports anywhere in its file: at the top, inside functions,
    under ``if TYPE_CHECKING``; ``from a import b`` counts as module ``a.b`` when there is one,
    relative imports are resolved against the file's package."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            targets = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")[:len(pkg.split(".")) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in n.names]
        else:
            continue
        for t in targets:
            while t and t not in known and "." in t:     # `import warmpath.a.b.C`-like: the module part
                t = t.rpartition(".")[0]
            if t in known and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the warmpath modules it imports."""
    mods = _modules()
    return {name: _imported(name, path, tree, set(mods)) for name, (path, tree) in mods.items()}


def layer_of(module: str) -> str:
    """``warmpath.router.flow`` → ``router``; a root module is a layer: ``warmpath.cli`` → ``cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "warmpath"


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between layers (edges inside one layer dropped)."""
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(layer_of(m), set()).update(layer_of(d) for d in deps if layer_of(d) != layer_of(m))
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as ``[a, b, ..., a]`` (the smallest-named start first), or ``None``.
    Depth-first with colours: an edge back to a node on the current path closes a cycle."""
    on_path: list[str] = []
    state: dict[str, int] = {}          # 1: on the path, 2: done (no cycle through it)

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        on_path.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return on_path[on_path.index(d):] + [d]
            if d not in state and (c := visit(d)) is not None:
                return c
        on_path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)) is not None:
            return c
    return None


def test_the_cycle_finder_finds_a_circle_and_names_it():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"y"}}) == ["y", "y"]
    assert find_cycle({"a": {"b", "d"}, "b": set(), "d": {"e"}, "e": {"d"}}) == ["d", "e", "d"]


def test_the_graph_sees_function_local_type_only_and_relative_imports(tmp_path):
    src = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from warmpath.router.state import RouterState\n"
           "def f():\n    from warmpath.routing import ppd\n    from . import flow\n    import warmpath.kv.hashing\n")
    known = {"warmpath.router.state", "warmpath.routing.ppd", "warmpath.router.flow", "warmpath.router",
             "warmpath.kv.hashing", "warmpath.router.dashboard"}
    got = _imported("warmpath.router.dashboard", ROOT / "router/dashboard.py", ast.parse(src), known)
    assert got == {"warmpath.router.state", "warmpath.routing.ppd", "warmpath.router.flow", "warmpath.kv.hashing"}
    graph = {"warmpath.router.dashboard": got, "warmpath.router.state": {"warmpath.router.dashboard"}}
    assert find_cycle(graph) == ["warmpath.router.dashboard", "warmpath.router.state", "warmpath.router.dashboard"]
    assert find_cycle(layer_graph({"warmpath.cli": {"warmpath.calibrate.served"},
                                   "warmpath.calibrate.served": {"warmpath.cli"}})) == ["calibrate", "cli", "calibrate"]


def test_no_module_imports_itself_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


def test_no_layer_imports_itself_back():
    cycle = find_cycle(layer_graph(import_graph()))
    assert cycle is None, "circle between layers: " + " -> ".join(cycle or ())


def test_every_layer_has_a_place():
    layers = {layer_of(m) for m in import_graph()} - {"warmpath"}
    assert sorted(layers - set(ALLOWED)) == [], "add the new layer to ALLOWED"


def test_no_upward_imports():
    graph = import_graph()
    bad = [f"{m} imports {d}" for m, deps in sorted(graph.items()) for d in sorted(deps)
           if layer_of(d) != layer_of(m) and layer_of(d) not in ALLOWED.get(layer_of(m), set()) | BASE]
    assert not bad, bad


def test_warmpath_never_imports_vllm():
    """vLLM workers are driven over HTTP and ZeroMQ (DESIGN §8): no module imports vllm."""
    bad = [path for path, tree in _modules().values() for n in ast.walk(tree)
           if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in n.names)
           or isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == "vllm"]
    assert not bad, bad


def _calls(attr: str):
    """Files of warmpath/ calling ``<something>.attr(...)`` or ``attr(...)``."""
    out = set()
    for path, tree in _modules().values():
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name == attr:
                    out.add(path.relative_to(ROOT).as_posix())
    return out


@pytest.mark.parametrize("call,where", [
    ("route", {"routing/route.py"}),                # the routing policy
    ("decide", {"routing/route.py"}),               # the PPD switch
    ("is_cold", {"routing/classify.py"}),
    ("label", {"routing/route.py", "routing/policy.py"}),          # the cold rule's verdict
    ("request_view", {"router/handler.py", "sim/simulation.py"}),
])
def test_each_decision_is_made_in_one_place(call, where):
    assert _calls(call) == where


def test_router_and_simulator_keep_every_request_in_one_ledger():
    """Admission, the session's turns, the latency model's feedback and the slot's release are
    booked by routing/ledger.py alone; the router and the simulator each drive one."""
    assert _calls("RequestLedger") == {"router/state.py", "sim/simulation.py"}
    assert _calls("observe_outcome") == {"routing/ledger.py"}
    assert _calls("turn_ended") == {"routing/ledger.py"}
    assert _calls("offer") == {"routing/ledger.py"}
    assert _calls("ended") >= {"router/flow.py", "sim/ending.py"}
    # the answers' own timings teach the worker lines the same way: the simulated router learns as the real one
    assert _calls("observe_answer") == {"routing/ledger.py", "routing/route.py"}   # route.py: to its model
    assert _calls("answered") >= {"router/flow.py", "sim/ending.py"}


def test_router_and_simulator_run_the_same_route_decider():
    assert _calls("RouteDecider") == {"router/state.py", "sim/simulation.py"}
    assert _calls("decide_route") == {"router/flow.py", "router/app.py", "sim/simulation.py"}


PROCESS_LIBS = {"fastapi", "httpx", "httpx_sse", "starlette", "uvicorn", "torch", "socket", "asyncio", "zmq", "requests"}


def _third_party_imports(tree: ast.Module) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out.update(a.name.split(".")[0] for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            out.add(n.module.split(".")[0])
    return out


def test_routing_is_pure():
    """routing/ is the decision and its books: no web framework, HTTP client, socket, event loop or torch."""
    bad = {name: sorted(_third_party_imports(tree) & PROCESS_LIBS) for name, (_, tree) in _modules().items()
           if layer_of(name) == "routing" and _third_party_imports(tree) & PROCESS_LIBS}
    assert bad == {}


def test_the_simulator_never_imports_the_router_process():
    graph = import_graph()
    bad = sorted(f"{m} imports {d}" for m, deps in graph.items() if layer_of(m) in ("sim", "plan")
                 for d in deps if layer_of(d) == "router")
    assert bad == []


BENCHMARKS = ROOT.parent / "benchmarks"


def test_no_benchmark_module_imports_itself_back():
    """benchmarks/ (its result tree aside) as warmpath/: no module imports itself back through
    others, function-local and type-only imports included."""
    mods = {name: m for name, m in _modules(BENCHMARKS).items() if "results" not in m[0].relative_to(BENCHMARKS).parts}
    assert "benchmarks.policies.ranking" in mods and "benchmarks.policies.ranking_sim" in mods
    graph = {name: _imported(name, path, tree, set(mods)) for name, (path, tree) in mods.items()}
    assert graph["benchmarks.policies.ranking_sim"], "the scan sees benchmarks' imports of each other"
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())

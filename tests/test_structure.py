"""The architecture as rules: layers import downwards only, and every routing decision is
made in one place (router/plan.py) that the router and the simulator both call."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "warmpath"

BASE = {"stats", "procs"}     # leaf modules any layer may use
# package -> the warmpath packages it may import (besides itself and BASE)
ALLOWED = {
    "stats": set(), "procs": set(), "models": set(), "protocol": set(),
    "kv": {"procs"},
    "engine": {"kv", "models"},
    "router": {"kv", "models", "protocol"},
    "worker": {"engine", "kv", "models", "protocol"},
    "bench": {"models", "protocol"},
    "sim": {"bench", "cluster", "engine", "kv", "router"},
    "cluster": {"kv", "procs", "protocol", "router"},
    # a vLLM server behind the router: its HTTP face, registration (torch-free) and events
    "vllm": {"cluster", "kv", "models", "protocol", "worker"},
    "calibrate": {"bench", "calibrate_served", "engine", "models", "router"},
    # the served phase starts a cluster as `warmpath serve` does and drives it with the bench
    "calibrate_served": {"bench", "cli", "cluster", "engine", "kv", "models"},
}


def _modules():
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT)
        yield (rel.parts[0] if len(rel.parts) > 1 else rel.stem), rel.as_posix(), ast.parse(p.read_text())


def _imports(tree):
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("warmpath."):
            yield n.module.split(".")[1]
        elif isinstance(n, ast.Import):
            yield from (a.name.split(".")[1] for a in n.names if a.name.startswith("warmpath."))


def test_no_upward_imports():
    bad = [f"{path} imports warmpath.{dep}" for pkg, path, tree in _modules() if pkg in ALLOWED
           for dep in _imports(tree) if dep != pkg and dep not in ALLOWED[pkg] | (BASE - {pkg})]
    assert not bad, bad


def test_warmpath_never_imports_vllm():
    """vLLM workers are driven over HTTP and ZeroMQ (DESIGN §8): no module imports vllm."""
    bad = [path for _, path, tree in _modules() for n in ast.walk(tree)
           if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in n.names)
           or isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == "vllm"]
    assert not bad, bad


def _calls(attr: str):
    """Files of warmpath/ calling ``<something>.attr(...)`` or ``attr(...)``."""
    out = set()
    for _, path, tree in _modules():
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name == attr:
                    out.add(path)
    return out


@pytest.mark.parametrize("call,where", [
    ("route", {"router/plan.py"}),                 # the routing policy
    ("decide", {"router/plan.py"}),                # the PPD switch
    ("is_cold", {"router/classify.py"}),
    ("label", {"router/plan.py", "router/policy.py"}),          # the cold rule's verdict
    ("request_view", {"router/handler.py", "sim/cluster.py"}),
])
def test_each_decision_is_made_in_one_place(call, where):
    assert _calls(call) == where


def test_router_and_simulator_run_the_same_planner():
    assert _calls("Planner") == {"router/state.py", "sim/cluster.py"}
    # (the KV tiers' own ``plan`` of loads is another method of that name)
    assert {p for p in _calls("plan") if p.startswith(("router/", "sim/cluster"))} == {
        "router/flow.py", "router/app.py", "sim/cluster.py"}

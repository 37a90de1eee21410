"""benchmarks/ is a package of question groups: every script sits in a group folder, reaches
the others only through ``benchmarks.<group>.<module>`` imports that exist, and never edits
``sys.path`` (run them as ``python -m benchmarks.<group>.<script>``)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
GROUPS = {"common", "engine", "peers", "policies", "sim_accuracy", "reliability", "repro", "tenants"}


def _scripts() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if "results" not in p.parts)


def _imports(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            out.add("." * n.level + n.module)
            out.update(f"{n.module}.{a.name}" for a in n.names if n.level == 0)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return out


def test_every_script_is_in_a_group_folder_with_an_init_and_a_readme():
    for p in _scripts():
        rel = p.relative_to(BENCH)
        assert len(rel.parts) == 1 and rel.name == "__init__.py" or rel.parts[0] in GROUPS, rel
    for g in GROUPS:
        assert (BENCH / g / "__init__.py").is_file(), g
        assert g == "common" or (BENCH / g / "README.md").is_file(), g


def test_no_script_edits_sys_path():
    for p in _scripts():
        tree = ast.parse(p.read_text())
        bad = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"
               and isinstance(n.value, ast.Name) and n.value.id == "sys"]
        assert bad == [], f"{p.relative_to(REPO)}: sys.path at lines {bad}"


def test_benchmark_imports_are_absolute_and_exist():
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in _scripts()}
    for p in _scripts():
        for i in _imports(p):
            assert not i.startswith("."), f"{p.relative_to(REPO)}: relative import {i}"
            if i.startswith("benchmarks."):
                # ``from benchmarks.x import y`` names a module (checked) or a name in one
                assert i in modules or i.rsplit(".", 1)[0] in modules, f"{p.relative_to(REPO)}: {i}"

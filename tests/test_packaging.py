"""pyproject.toml declares what the code imports (and nothing else), in step with the pins in
requirements/*.txt, and every warmpath directory with code is a package ``pip install .`` ships."""

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# needed but never imported: pytest loads the plugin for ``timeout`` in [tool.pytest.ini_options];
# transformers loads accelerate itself to read a GGUF file (tests/models' reference model)
NOT_IMPORTED = {"pytest-timeout", "accelerate"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def top_level_imports(*dirs: str) -> set[str]:
    """Absolute top-level module names imported anywhere under ``dirs`` (local modules excluded)."""
    found, local = set(), {"warmpath", "tests", "benchmarks"}
    for d in dirs:
        for p in (ROOT / d).rglob("*.py"):
            local.add(p.stem)
            for n in ast.walk(ast.parse(p.read_text())):
                if isinstance(n, ast.Import):
                    found |= {a.name.split(".")[0] for a in n.names}
                elif isinstance(n, ast.ImportFrom) and n.level == 0:
                    found.add(n.module.split(".")[0])
    return {m for m in found - local if m not in sys.stdlib_module_names}


def distributions(modules: set[str]) -> set[str]:
    dists = md.packages_distributions()
    missing = sorted(m for m in modules if m not in dists)
    assert not missing, f"imported but not installed: {missing}"
    return {norm(dists[m][0]) for m in modules}


def declared(reqs: list[str]) -> dict[str, Requirement]:
    return {norm(r.name): r for r in map(Requirement, reqs)}


def pins(path: Path) -> dict[str, Requirement]:
    lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return declared([ln for ln in lines if ln and not ln.startswith("-r")])


# extras warmpath imports only where they are used (``warmpath deploy --ray``: ray); the extra's
# distribution and its module share the name, and it need not be installed (`make test` does not)
OPTIONAL = set(declared(PROJECT["optional-dependencies"]["ray"]))


def test_runtime_dependencies_are_exactly_what_warmpath_imports():
    assert set(declared(PROJECT["dependencies"])) == distributions(top_level_imports("warmpath") - OPTIONAL)
    assert OPTIONAL == {"ray"} and not OPTIONAL & set(declared(PROJECT["dependencies"]))


def test_test_extra_is_exactly_what_tests_and_benchmarks_add():
    runtime = set(declared(PROJECT["dependencies"]))
    extra = distributions(top_level_imports("tests", "benchmarks") - OPTIONAL) - runtime
    assert set(declared(PROJECT["optional-dependencies"]["test"])) == extra | NOT_IMPORTED


def test_requirement_pins_fall_in_the_declared_ranges_with_the_same_markers():
    for reqs, path in ((PROJECT["dependencies"], "base.txt"),
                       (PROJECT["optional-dependencies"]["test"], "test.txt"),
                       (PROJECT["optional-dependencies"]["ray"], "ray.txt")):
        want, pinned = declared(reqs), pins(ROOT / "requirements" / path)
        assert set(pinned) == set(want), path
        for name, pin in pinned.items():
            (spec,) = pin.specifier
            assert spec.operator == "==", f"{path}: {pin} is not a pin"
            assert want[name].specifier.contains(spec.version, prereleases=True), f"{pin} vs {want[name]}"
            assert str(pin.marker) == str(want[name].marker), name
    assert str(declared(PROJECT["dependencies"])["mooncake-transfer-engine-non-cuda"].marker) == \
        'platform_machine == "x86_64"'


def test_every_code_directory_is_a_package_and_its_data_files_are_declared():
    for d in (ROOT / "warmpath").rglob("*"):
        if d.is_dir() and d.name != "__pycache__":
            assert (d / "__init__.py").exists() or not any(d.glob("*.py")), d
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    # compiled extension modules (setup.py builds them in place for an editable install) are code
    data = [p for p in (ROOT / "warmpath").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc", ".so", ".pyd")]
    undeclared = [str(p.relative_to(ROOT)) for p in data
                  if not any(p.relative_to(ROOT / pkg.replace(".", "/")).match(g)
                             for pkg, globs in declared.items() if p.is_relative_to(ROOT / pkg.replace(".", "/"))
                             for g in globs)]
    assert undeclared == [], "package data: declare it in [tool.setuptools.package-data]"
    assert sorted(p.name for p in data if p.parent.name != "models") == ["dashboard.css", "dashboard.html", "dashboard.js"]
    # and the simulator's bundled model configs with their sources (warmpath/sim/models/)
    assert {p.suffix for p in data if p.parent.name == "models"} == {".json", ".md"}

"""docs/modules.md is true: a row per module, no row for a file that is gone, and the
torch column says whether importing the module loads torch (at import time, transitively)."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rows() -> dict[str, str]:
    text = (REPO / "docs/modules.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+\.py)` \|.*\| (yes|no) \|$", text, re.M)}


def _module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is imported (module level, incl. if/try blocks)."""
    out = set()
    for top in ast.parse(path.read_text()).body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(top, ast.If) and ast.unparse(top.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            continue   # for type checkers only: never imported at run time
        for n in ast.walk(top):
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                out.add(n.module)
                out.update(f"{n.module}.{a.name}" for a in n.names)
            elif isinstance(n, ast.Import):
                out.update(a.name for a in n.names)
    return out


def _torch_map() -> dict[str, bool]:
    files = {_module_of(p): p for d in ("warmpath", "benchmarks") for p in (REPO / d).rglob("*.py")}
    memo: dict[str, bool] = {}

    def torchy(mod: str, stack: tuple = ()) -> bool:
        if mod not in memo:
            imports = _load_time_imports(files[mod])
            memo[mod] = any(i == "torch" or i.startswith("torch.") or
                            (i in files and i != mod and i not in stack and torchy(i, stack + (mod,)))
                            for i in imports)
        return memo[mod]
    return {str(p.relative_to(REPO)): torchy(m) for m, p in files.items()}


def test_every_module_has_a_true_row():
    rows, truth = _rows(), _torch_map()
    modules = {f for f in truth if not f.endswith("__init__.py")}
    assert sorted(modules - set(rows)) == [], "modules without a row in docs/modules.md"
    assert sorted(set(rows) - modules) == [], "rows for files that do not exist"
    wrong = {f: rows[f] for f in modules if (rows[f] == "yes") != truth[f]}
    assert wrong == {}, "torch column wrong"


def test_the_cli_page_is_the_parsers():
    from warmpath.cli_reference import render

    page = (REPO / "docs/cli.md").read_text()
    assert page == render(), "docs/cli.md is stale: run python -m warmpath.cli_reference > docs/cli.md"


def test_front_page_links_point_to_files():
    """Every relative link of README.md, docs/cli.md and docs/api.md names a file or folder that exists."""
    missing = []
    for page in ("README.md", "docs/cli.md", "docs/api.md"):
        path = REPO / page
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" not in target and not (path.parent / target).exists():
                missing.append(f"{page}: {target}")
    assert missing == []

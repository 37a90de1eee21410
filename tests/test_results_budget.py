"""``benchmarks/results/`` stays within its budget: 10 MiB of tracked files (their sizes on disk;
untracked files are not counted). A new result folder is packed before it is committed
(``python -m benchmarks.common.results --pack DIR``: large JSON and logs gzipped, plots and
pages left out; see ``benchmarks/common/results.py``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
BUDGET = 10 * 2**20          # bytes: 10 MiB, as `du -h` counts


def tracked_sizes(repo: Path = REPO, folder: str = RESULTS) -> dict[str, int]:
    """Each file git tracks under ``folder`` (path relative to ``repo``) → its size on disk."""
    out = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=repo, capture_output=True, check=True).stdout
    paths = [p for p in out.decode().split("\0") if p]
    return {p: (repo / p).stat().st_size for p in paths if (repo / p).is_file()}


def over_budget(sizes: dict[str, int], budget: int = BUDGET, folder: str = RESULTS) -> str | None:
    """None within ``budget``; else what to say: the total, and the five largest entries of
    ``folder`` (its folders summed) and its five largest files."""
    total = sum(sizes.values())
    if total <= budget:
        return None
    entries: dict[str, int] = {}
    for p, n in sizes.items():
        top = p[len(folder) + 1:].split("/")[0]
        entries[top] = entries.get(top, 0) + n
    mib = lambda n: f"{n / 2**20:.2f} MiB"  # noqa: E731
    big = sorted(entries.items(), key=lambda x: -x[1])[:5]
    files = sorted(sizes.items(), key=lambda x: -x[1])[:5]
    return (f"{folder}/ holds {mib(total)} of tracked files, over its {mib(budget)} budget. "
            f"Largest entries: {', '.join(f'{folder}/{k} ({mib(n)})' for k, n in big)}. "
            f"Largest files: {', '.join(f'{k} ({mib(n)})' for k, n in files)}. "
            "Pack new results with `python -m benchmarks.common.results --pack DIR` (or leave out what a "
            "command rebuilds).")


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git checkout")
def test_the_results_tree_stays_within_its_budget():
    sizes = tracked_sizes()
    assert sizes, f"git lists no file under {RESULTS}"
    problem = over_budget(sizes)
    assert problem is None, problem


def test_over_budget_names_the_total_and_the_five_largest_entries():
    mib = 2**20
    sizes = {f"{RESULTS}/run{i}/requests.jsonl": i * mib for i in range(1, 8)}
    sizes[f"{RESULTS}/run7/summary.json"] = mib // 2
    sizes[f"{RESULTS}/notes.md"] = 10
    assert over_budget(sizes, budget=100 * mib) is None
    msg = over_budget(sizes)
    assert msg.startswith(f"{RESULTS}/ holds 28.50 MiB of tracked files, over its 10.00 MiB budget.")
    entries = msg.split("Largest entries: ")[1].split(". Largest files")[0]
    assert entries == ", ".join([f"{RESULTS}/run7 (7.50 MiB)"] + [f"{RESULTS}/run{i} ({i}.00 MiB)" for i in (6, 5, 4, 3)])
    assert f"{RESULTS}/run7/requests.jsonl (7.00 MiB)" in msg and "run2" not in msg


def test_tracked_sizes_count_tracked_files_only(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / RESULTS / "a").mkdir(parents=True)
    (tmp_path / RESULTS / "a" / "kept.json").write_text("x" * 100)
    (tmp_path / RESULTS / "a" / "scratch.json").write_text("y" * 5000)      # never added
    git("add", f"{RESULTS}/a/kept.json")
    assert tracked_sizes(tmp_path) == {f"{RESULTS}/a/kept.json": 100}

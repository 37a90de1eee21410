"""The headline table of ``docs/benchmarks.md`` against the result files it cites.

Each row: ``| claim | number | baseline | command | date | result |``. The *result* cell names
one or more ``\\`path\\` · \\`key path\\``` pairs (separated by ``<br>``): the first gives the
*number*, a second (if any) the first number in *baseline*. A key path walks the JSON from
its root: ``.name`` (names of letters, digits, ``_`` and ``-``), ``["any key"]`` and ``[index]``,
e.g. ``cpd.max_rate_meeting_slo["cpd-1d"]`` or ``seed_vs_ours[19].ours``. Result files may be
gzipped. A printed number equals the value when rounding the value to the printed decimals
gives it (a ``%`` number is the value × 100; thousands separators, ``−`` and a unit after the
number are allowed):

    python -m benchmarks.common.headline [docs/benchmarks.md]     # each row: ok, or what differs
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common.results import read_json

REPO = Path(__file__).resolve().parents[2]
HEADER = ("claim", "number", "baseline", "command", "date", "result")
NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(\d[\d,]*(?:\.\d+)?)\s*(%?)")
REF = re.compile(r"`([^`]+)`\s*·\s*`([^`]+)`")
STEP = re.compile(r'\.?([A-Za-z_][\w-]*)|\["([^"]+)"\]|\[(\d+)\]')


@dataclass(frozen=True)
class Printed:
    """A number as the table prints it: its value, decimals and whether it is a percentage."""
    value: float
    decimals: int
    percent: bool


@dataclass(frozen=True)
class Row:
    claim: str
    number: str
    baseline: str
    command: str
    date: str
    refs: tuple[tuple[str, str], ...]


def parse_number(text: str) -> Printed:
    """The first number in ``text`` (``**27.6×**``, ``−29%``, ``100,074 requests``)."""
    m = NUMBER.search(text.replace("**", ""))
    if not m:
        raise ValueError(f"no number in {text!r}")
    sign, digits, pct = m.groups()
    value = float(digits.replace(",", "")) * (-1 if sign in ("-", "−") else 1)
    return Printed(value, len(digits.split(".")[1]) if "." in digits else 0, pct == "%")


def lookup(data, path: str):
    """The value at ``path`` (see the module docstring) in ``data``."""
    pos, out = 0, data
    while pos < len(path):
        m = STEP.match(path, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad key path {path!r} at {pos}")
        name, quoted, index = m.groups()
        out = out[int(index)] if index is not None else out[name if name is not None else quoted]
        pos = m.end()
    return out


def agrees(printed: Printed, value) -> bool:
    """Whether ``value`` from a result file prints as ``printed``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    v = value * 100 if printed.percent else value
    return abs(round(v, printed.decimals) - printed.value) < 1e-9


def table_rows(markdown: str) -> list[Row]:
    """The rows of the first table whose header is :data:`HEADER`."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip().lower() for c in line.strip().strip("|").split("|")]
        if tuple(cells) == HEADER:
            break
    else:
        raise ValueError("no headline table (| " + " | ".join(HEADER) + " |)")
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(HEADER):
            raise ValueError(f"{len(cells)} cells, not {len(HEADER)}: {line}")
        refs = tuple(REF.findall(cells[5]))
        if not refs:
            raise ValueError(f"no `path` · `key` in the result cell: {line}")
        rows.append(Row(*cells[:5], refs))
    return rows


def check(row: Row, root: Path = REPO) -> list[str]:
    """What in ``row`` disagrees with its result files (empty: all agree)."""
    problems = []
    for (path, key), cell in zip(row.refs, (row.number, row.baseline)):
        try:
            value = lookup(read_json(root / path), key)
        except (OSError, KeyError, IndexError, TypeError, ValueError) as e:
            problems.append(f"{row.claim}: {path} · {key}: {type(e).__name__} {e}")
            continue
        printed = parse_number(cell)
        if not agrees(printed, value):
            problems.append(f"{row.claim}: prints {cell!r}, {path} · {key} is {value!r}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("doc", nargs="?", type=Path, default=REPO / "docs/benchmarks.md", help="the page with the table")
    a = p.parse_args(argv)
    bad = 0
    for row in table_rows(a.doc.read_text()):
        problems = check(row)
        bad += bool(problems)
        print("ok   " + row.claim if not problems else "\n".join("DIFF " + p for p in problems))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""``warmpath map``'s cell cache: one JSON line per finished (cell, arm) run, so an interrupted
or grown map resumes where it stopped (pure, no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

GRID_FIELDS = ("cold_shares", "cold_tokens", "answers", "splits", "histories", "appends", "links_gbps", "loads",
               "arms", "tpot_targets")


def task_key(config: dict, cell: dict, arm: str) -> str:
    """What a finished run depends on, as one string: the config (``asdict(MapConfig)``) but
    its grid axes, arms and TPOT targets (a run sees only its own cell, so a grown grid reuses
    the runs it shares), the cell (CPD: with its ``tpot_target``), the arm."""
    settings = {k: v for k, v in config.items() if k not in GRID_FIELDS}
    return json.dumps({"config": settings, "cell": cell, "arm": arm}, sort_keys=True)


def load_cache(path: Path | None) -> dict[str, dict]:
    """``cells.jsonl``: one line per finished (cell, arm) run, keyed by :func:`task_key`;
    a torn last line (a run killed mid-write) is skipped."""
    found: dict[str, dict] = {}
    if path is None or not path.exists():
        return found
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            found[rec["key"]] = rec["result"]
        except (ValueError, KeyError, TypeError):
            continue
    return found


def open_cache(path: Path) -> IO[str]:
    """The cache opened for appending (its folder made); a torn last line is ended first, so
    the next line parses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n")
    sink = path.open("a")
    if torn:
        sink.write("\n")
    return sink


def append(sink: IO[str], key: str, result: dict) -> None:
    """One finished run, written through at once (a kill loses at most the run in progress)."""
    sink.write(json.dumps({"key": key, "result": result}) + "\n")
    sink.flush()

"""Reading result files that may be gzipped: ``benchmarks/results/`` keeps bulky raw output
(per-sample series, server logs) as ``.gz``, and a reader takes either form."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def read_text(path) -> str:
    """``path``'s text; ``*.gz`` is decompressed, and a missing ``X`` is read from ``X.gz``."""
    path = Path(path)
    if path.suffix != ".gz" and not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def read_json(path):
    """A JSON result file, plain or gzipped (see :func:`read_text`)."""
    return json.loads(read_text(path))

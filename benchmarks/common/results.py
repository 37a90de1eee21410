"""The results tree's files: reading them plain or gzipped, and rebuilding the pages it leaves out.

``benchmarks/results/`` keeps bulky raw output (per-sample series, server logs) as ``.gz``,
and a reader takes either form (:func:`read_text`, :func:`read_json`). It keeps a
``warmpath bench --out DIR`` run's ``summary.json`` and PNG plots but not its ``report.html``
(those, inlined, doubling their size); :func:`page` writes it again, the same bytes
``warmpath bench`` wrote:

    python -m benchmarks.common.results benchmarks/results/vs_llamacpp/warmpath-coding-agent [DIR ...]
        [--out-root /tmp/reports]      # write DIR's page under this folder instead of into DIR
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from warmpath.bench.report import render_report

PLOTS = ("cpd_fig4.png", "ppd_turn2.png")   # what warmpath bench's plot_summaries draws, in its order


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


def page(run: Path) -> str:
    """The HTML of ``run``'s report, titled as ``warmpath bench`` titles it (its target URL)."""
    summary = json.loads((run / "summary.json").read_text())
    plots = [run / p for p in PLOTS if (run / p).exists()]
    plots += sorted(p for p in run.glob("*.png") if p.name not in PLOTS)
    return render_report(summary, plots, f"warmpath bench: {summary.get('target', run.name)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run folders holding a summary.json")
    p.add_argument("--out-root", type=Path, default=None, help="write RUN's page to OUT_ROOT/RUN/report.html")
    a = p.parse_args(argv)
    for run in a.runs:
        out = (a.out_root / run) if a.out_root else run
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.html").write_text(page(run), encoding="utf-8")
        print(f"wrote {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

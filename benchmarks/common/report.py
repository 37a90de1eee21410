"""Rebuild the ``report.html`` of a ``warmpath bench --out DIR`` run from what stays in the
repository beside it: ``summary.json`` and the run's PNG plots (the page is those, inlined).

``benchmarks/results/`` keeps the summaries and the figures but not the pages, which double
their size; this writes a run's page again, the same bytes ``warmpath bench`` wrote:

    python -m benchmarks.common.report benchmarks/results/vs_llamacpp/warmpath-coding-agent [DIR ...]
        [--out-root /tmp/reports]      # write DIR's page under this folder instead of into DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from warmpath.bench.report import render_report

PLOTS = ("cpd_fig4.png", "ppd_turn2.png")   # what warmpath bench's plot_summaries draws, in its order


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

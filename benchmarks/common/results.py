"""The results tree's files: reading them plain or gzipped, packing a result folder to the tree's
budget, and drawing again what it leaves out.

``benchmarks/results/`` stays under 10 MiB (``tests/test_results_budget.py``). What a run wrote
is kept as :func:`pack` leaves it:

* a JSON, JSON-lines or log file over 16 KiB (per-request ``requests.jsonl``, step traces,
  server logs, large summaries, ``map.json``) is gzipped to ``X.gz``; calibrations and
  ``repro.json`` stay plain whatever their size (``warmpath … --calibration`` and ``warmpath repro
  --report-only`` read them), and so do the files named with ``--keep``;
* PNG plots, ``report.html``, ``results.csv`` and ``cells.jsonl`` are left out: the plots and
  the page are drawn again from the JSON that stays (:func:`draw`, :func:`page`),
  ``results.csv`` repeats ``summary.json``'s ``rates``, and ``cells.jsonl`` is ``warmpath map``'s
  resume cache (its ``map.json`` holds every cell).

A reader takes either form: :func:`read_text`, :func:`read_json`, :func:`read_jsonl` and
:func:`stored` read a missing ``X`` from ``X.gz`` (a plain ``X`` wins when both are there).

    python -m benchmarks.common.results RUN [RUN ...] [--out-root R]   # a warmpath bench run's report.html
    python -m benchmarks.common.results --plots DIR [DIR ...] [--out-root R]   # DIR's figures
    python -m benchmarks.common.results --pack DIR [DIR ...] [--keep FILE ...]  # before committing DIR

``--plots`` draws ``warmpath bench`` / ``warmpath sim`` runs (``summary.json``: ``cpd_fig4.png``,
``ppd_turn2.png``), ``real_policies.py`` folders (``cluster.json`` beside one run folder per
config), ``vs_llamacpp.py``'s per-workload folders (the ``all.json`` above them), ``warmpath map``
(``map.json``) and ``warmpath plan`` (``plan.json``). The others draw their own:
``warmpath repro cpd|ppd --report-only --out DIR`` and ``python -m benchmarks.repro.ppd_points
--report`` (``cpd_vs_blog.png``, ``ppd_vs_paper.png``), ``python -m benchmarks.reliability.soak
--reanalyse DIR/LABEL.json.gz --label LABEL`` (the soak's plots).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import json
import sys
import tempfile
from pathlib import Path

PLOTS = ("cpd_fig4.png", "ppd_turn2.png")   # what warmpath bench's plot_summaries draws, in its order
GZIP_OVER = 16 * 1024                        # bytes: a larger JSON / JSON-lines / log file is kept gzipped
GZIPPED = ("*.json", "*.jsonl", "*.log")
PLAIN = ("calibration*.json", "repro.json")  # read plain by warmpath itself, whatever their size
LEFT_OUT = ("*.png", "report.html", "results.csv", "cells.jsonl")


def stored(path) -> Path | None:
    """Where the tree keeps ``path``: ``path`` itself, else ``path.gz``; None when neither exists."""
    path = Path(path)
    if path.exists():
        return path
    packed = path.with_name(path.name + ".gz")
    return packed if path.suffix != ".gz" and packed.exists() else None


def read_text(path) -> str:
    """``path``'s text; ``*.gz`` is decompressed, and a missing ``X`` is read from ``X.gz``."""
    path = stored(path) or Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8")


def read_json(path):
    """A JSON result file, plain or gzipped (see :func:`read_text`)."""
    return json.loads(read_text(path))


def read_jsonl(path) -> list:
    """A JSON-lines result file (``requests.jsonl``, a step trace), plain or gzipped: its non-blank lines."""
    return [json.loads(x) for x in read_text(path).splitlines() if x.strip()]


def pack_action(path: Path, keep: tuple[Path, ...] = ()) -> str | None:
    """What :func:`pack` does with ``path``: ``"gzip"``, ``"drop"`` or None (kept as it is)."""
    name = path.name
    if path.suffix == ".gz" or any(path.resolve() == Path(k).resolve() for k in keep):
        return None
    if any(fnmatch.fnmatch(name, p) for p in LEFT_OUT):
        return "drop"
    if any(fnmatch.fnmatch(name, p) for p in PLAIN):
        return None
    if any(fnmatch.fnmatch(name, p) for p in GZIPPED) and path.stat().st_size > GZIP_OVER:
        return "gzip"
    return None


def pack(folder: Path, keep: tuple[Path, ...] = ()) -> list[tuple[Path, str, int, int]]:
    """Pack every file under ``folder`` (:func:`pack_action`): ``X`` becomes ``X.gz`` (level 9, no
    name or time in the header, so the same bytes give the same file) or is deleted. Returns
    (path, action, bytes before, bytes after) per file changed."""
    done = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        action = pack_action(path, keep)
        if action is None:
            continue
        size = path.stat().st_size
        if action == "gzip":
            packed = path.with_name(path.name + ".gz")
            packed.write_bytes(gzip.compress(path.read_bytes(), 9, mtime=0))
            done.append((packed, action, size, packed.stat().st_size))
        else:
            done.append((path, action, size, 0))
        path.unlink()
    return done


def _bench_plots(summaries: dict, out: Path) -> list[Path]:
    from warmpath.bench.plots import plot_summaries

    return plot_summaries(summaries, out) if summaries else []


def _config_runs(folder: Path) -> dict:
    """``real_policies.py``'s part cpd: each config's summary (its run folder is the config's
    name, ``:`` as ``-``, a path by its stem); without configs, every run folder inside."""
    configs = ((read_json(folder / "cluster.json").get("cpd") or {}).get("configs") or []) \
        if stored(folder / "cluster.json") else []
    if configs:
        runs = {t: folder / Path(t.replace(":", "-")).stem for t in configs}
    else:
        runs = {d.name: d for d in sorted(folder.iterdir()) if d.is_dir()}
    return {t: read_json(d / "summary.json") for t, d in runs.items() if stored(d / "summary.json")}


def draw(folder: Path, out: Path | None = None) -> list[Path]:
    """Draw ``folder``'s figures again from the JSON the tree keeps (see the module docstring for
    the kinds), into ``out`` (default: ``folder``); the PNGs written."""
    folder = Path(folder)
    out = Path(out or folder)
    if stored(folder / "summary.json"):
        summary = read_json(folder / "summary.json")
        return _bench_plots({summary.get("target", folder.name): summary}, out)
    if stored(folder / "map.json"):
        from warmpath.sim.map_plot import plot_map

        return plot_map(read_json(folder / "map.json"), out)
    if stored(folder / "plan.json"):
        from warmpath.plan.report import plot

        out.mkdir(parents=True, exist_ok=True)
        return [plot(read_json(folder / "plan.json"), out / "plan.png")]
    if stored(folder / "cluster.json"):
        return _bench_plots(_config_runs(folder), out)
    if stored(folder.parent / "all.json"):     # vs_llamacpp.py: one folder of plots per workload
        work = read_json(folder.parent / "all.json").get("workloads", {})
        return _bench_plots({k.split("/")[0]: v for k, v in work.items() if k.endswith("/" + folder.name)}, out)
    return []


def page(run: Path) -> str:
    """The HTML of ``run``'s report, titled as ``warmpath bench`` titles it (its target URL); its
    PNGs inlined, drawn again (:func:`draw`) when the folder keeps none."""
    from warmpath.bench.report import render_report

    summary = read_json(run / "summary.json")
    title = f"warmpath bench: {summary.get('target', run.name)}"
    plots = [run / p for p in PLOTS if (run / p).exists()]
    plots += sorted(p for p in run.glob("*.png") if p.name not in PLOTS)
    if plots:
        return render_report(summary, plots, title)
    with tempfile.TemporaryDirectory() as tmp:
        return render_report(summary, draw(run, Path(tmp)), title)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, help="run folders holding a summary.json (or, with --plots / "
                   "--pack, any result folder)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plots", action="store_true", help="draw each folder's figures again (no report.html)")
    mode.add_argument("--pack", action="store_true", help="gzip / leave out each folder's files as the tree keeps them")
    p.add_argument("--keep", type=Path, action="append", default=[], help="with --pack: a file to keep as it is")
    p.add_argument("--out-root", type=Path, default=None, help="write DIR's files under OUT_ROOT/DIR instead")
    a = p.parse_args(argv)
    rc = 0
    for d in a.dirs:
        out = (a.out_root / d) if a.out_root else d
        if a.pack:
            done = pack(d, tuple(a.keep))
            before, after = sum(x[2] for x in done), sum(x[3] for x in done)
            print(f"{d}: {sum(x[1] == 'gzip' for x in done)} gzipped, {sum(x[1] == 'drop' for x in done)} left out; "
                  f"{before:,} -> {after:,} bytes")
        elif a.plots:
            try:
                drawn = draw(d, out)
            except (KeyError, TypeError, ValueError) as e:    # a file older than its plotter
                print(f"{d}: not drawn ({type(e).__name__}: {e})", file=sys.stderr)
                drawn, rc = [], 1
            for path in drawn:
                print(f"wrote {path}")
        else:
            out.mkdir(parents=True, exist_ok=True)
            (out / "report.html").write_text(page(d), encoding="utf-8")
            print(f"wrote {out / 'report.html'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())

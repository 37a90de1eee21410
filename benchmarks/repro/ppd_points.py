"""The grid points of ``warmpath repro ppd`` one at a time (each is ``repro._ppd_run``), key
points first, one JSON line per point as it completes: usable while the machine is busy and
a full ``repro ppd`` (grid + bandwidth sweep, printed at the end) would not finish.
Resumable: points already in ``--out`` are skipped. ``--net`` runs the bandwidth sweep
(2P2D at 12 sessions/s, x=0 and dynamic, 400 → 25 Gb/s) instead of the grid; ``--report``
only writes ``repro.json``, ``compare.md`` (seed vs ours) and ``ppd_vs_paper.png`` beside
``--out`` from the points there.

    python -m benchmarks.repro.ppd_points --duration 120 --out benchmarks/results/repro_ppd_120s/points.jsonl
        [--modes x0,x1,dynamic] [--points 24/3P1D,12/2P2D] [--net] [--report]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from warmpath.sim.repro import PAPER, PPD_SPLITS, _ppd_run
from warmpath.sim.repro_compare import markdown, ppd_rows
from warmpath.sim.repro_plot import ppd_figure

ORDER = [(24.0, "3P1D"), (24.0, "2P2D"), (12.0, "3P1D"), (24.0, "1P3D"), (12.0, "2P2D"), (12.0, "1P3D"),
         (4.0, "3P1D"), (4.0, "2P2D"), (4.0, "1P3D")]
NET_GBPS, NET_RATE, NET_SPLIT = (400, 200, 100, 50, 25), 12.0, "2P2D"


def todo(a: argparse.Namespace, have: set) -> list[tuple]:
    """(rate, split, mode, nic Gb/s or None) still to run, in order."""
    if a.net:
        pts = [(NET_RATE, NET_SPLIT, m, g) for g in NET_GBPS for m in ("x0", "dynamic")]
    else:
        only = {(float(x.split("/")[0]), x.split("/")[1]) for x in a.points.split(",")} if a.points else None
        pts = [(r, s, m, None) for r, s in ORDER if not only or (r, s) in only for m in a.modes.split(",")]
    return [p for p in pts if p not in have]


def report(rows: list[dict], out: Path) -> dict:
    """The points as ``repro ppd``'s result (``table``, bandwidth sweep), plus the seed-vs-ours
    rows; writes ``repro.json``, ``compare.md`` and ``ppd_vs_paper.png`` into ``out``."""
    table = {f"{r['rate']}/{r['split']}-{r['mode']}": r for r in rows if r.get("nic_gbps") is None}
    net = {}
    for r in rows:
        if r.get("nic_gbps") is not None:
            net.setdefault(str(r["nic_gbps"]), {})["PD" if r["mode"] == "x0" else "PPD"] = r["turn2_ttft_p50_s"]
    net = {g: v for g, v in net.items() if len(v) == 2}
    cmp = ppd_rows(table, net)
    res = {"paper": PAPER, "steady_s": sorted({r.get("duration_s") for r in rows} - {None}), "table": table,
           "bandwidth_sweep_turn2_ttft_p50_s": net, "bandwidth_sweep_point": f"{NET_RATE:g}/{NET_SPLIT}",
           "seed_vs_ours": cmp}
    (out / "repro.json").write_text(json.dumps(res, indent=1))
    (out / "compare.md").write_text(markdown(cmp))
    ppd_figure(table, net, out / "ppd_vs_paper.png", f"{NET_SPLIT}, {NET_RATE:g} sessions/s")
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--modes", default="x0,x1,dynamic")
    p.add_argument("--points", default=None, help="rate/split pairs, e.g. 24/3P1D (default: all nine)")
    p.add_argument("--net", action="store_true", help="the bandwidth sweep instead of the grid")
    p.add_argument("--report", action="store_true", help="only write the report from --out's points")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in a.out.read_text().splitlines() if x.strip()] if a.out.exists() else []
    if not a.report:
        have = {(r["rate"], r["split"], r["mode"], r.get("nic_gbps")) for r in rows}
        for rate, split, mode, gbps in todo(a, have):
            t = time.time()
            res = _ppd_run(*PPD_SPLITS[split], mode, gbps, rate, a.duration, a.seed)
            row = {"rate": rate, "split": split, "mode": mode, "nic_gbps": gbps, "duration_s": a.duration,
                   "wall_s": round(time.time() - t), **res}
            rows.append(row)
            with a.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
    report(rows, a.out.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())

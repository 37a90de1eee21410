"""The grid points of ``warmpath repro ppd`` one at a time (each is ``repro._ppd_run``), key
points first, one JSON line per point as it completes: usable while the machine is busy and
a full ``repro ppd`` (grid + bandwidth sweep, printed at the end) would not finish.

    python benchmarks/ppd_points.py --duration 40 --out benchmarks/results/repro_ppd_40s/points.jsonl
        [--modes x0,x1,dynamic] [--points 24/3P1D,12/2P2D]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from warmpath.sim.repro import PPD_SPLITS, _ppd_run

ORDER = [(24.0, "3P1D"), (24.0, "2P2D"), (12.0, "3P1D"), (24.0, "1P3D"), (12.0, "2P2D"), (12.0, "1P3D"),
         (4.0, "3P1D"), (4.0, "2P2D"), (4.0, "1P3D")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--modes", default="x0,x1,dynamic")
    p.add_argument("--points", default=None, help="rate/split pairs, e.g. 24/3P1D (default: all nine)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    only = {(float(x.split("/")[0]), x.split("/")[1]) for x in a.points.split(",")} if a.points else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for rate, split in ORDER:
        if only and (rate, split) not in only:
            continue
        n_p, n_d = PPD_SPLITS[split]
        for mode in a.modes.split(","):
            t = time.time()
            res = _ppd_run(n_p, n_d, mode, None, rate, a.duration, a.seed)
            with a.out.open("a") as f:
                f.write(json.dumps({"rate": rate, "split": split, "mode": mode, "wall_s": round(time.time() - t),
                                    **res}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

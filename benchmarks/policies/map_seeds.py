"""Issue 29's map goal over several seeds: in each cell of ``warmpath map cpd`` outputs (one
``map.json`` per seed), the adaptive arm's goodput against the best fixed arm's — met when it
is at least ``share`` (0.97) times it, or when no fixed arm sustains the grid's lowest rate.

    python -m benchmarks.policies.map_seeds --arm goodput-replica \\
        benchmarks/results/map_b200_hybrid/cpd/map.json benchmarks/results/map_b200_hybrid_s1/cpd/map.json \\
        --out benchmarks/results/map_b200_hybrid_seeds.json

Prints one row per cell and target with each seed's ratio, and the count met per seed and per
TPOT target; writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common.results import read_json
from warmpath.sim.map_cpd import FIXED_ARMS, winner

SHARE = 0.97


def cell_key(c: dict) -> str:
    return f"{c['split']} cold {c['cold_share']:g} doc {c['cold_tokens'] // 1024}K answer {c['answer']}"


def verdict(arm: float | None, best: float | None, share: float = SHARE) -> tuple[float | None, bool]:
    """(arm / best or ``None`` where best sustains nothing, met): ``None`` goodputs are 0."""
    a, b = arm or 0.0, best or 0.0
    if b == 0:
        return None, True
    return a / b, a >= share * b - 1e-12


def compare(maps: dict[str, dict], arm: str, fixed: tuple[str, ...] = FIXED_ARMS, share: float = SHARE) -> dict:
    """Per seed (``maps``: seed label → ``map.json``), cell and TPOT target: the best fixed
    arm's goodput, the arm's, the ratio and whether it met ``share``; the counts met."""
    rows, counts = [], {}
    for seed, m in maps.items():
        if arm not in m["arms"]:
            raise ValueError(f"seed {seed}: the map has no arm {arm!r} (arms {m['arms']})")
        for c in m["cells"]:
            for t in m["tpot_targets"]:
                best = winner({a: c["arms"][a][t]["goodput"] for a in fixed if a in c["arms"]}, m["config"]["rates"])
                ratio, met = verdict(c["arms"][arm][t]["goodput"], best["goodput"], share)
                rows.append({"seed": seed, "cell": cell_key(c), "tpot": t, "best_fixed": best["goodput"],
                             "best_arms": best["arms"],
                             "arm": c["arms"][arm][t]["goodput"], "ratio": ratio, "met": met})
                k = counts.setdefault(seed, {}).setdefault(t, [0, 0])
                k[0] += met
                k[1] += 1
    return {"arm": arm, "share": share, "fixed": list(fixed), "rows": rows,
            "met": {s: {t: f"{m}/{n}" for t, (m, n) in ts.items()} for s, ts in counts.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("maps", nargs="+", type=Path, help="map.json files, one per seed")
    p.add_argument("--arm", default="goodput-replica")
    p.add_argument("--share", type=float, default=SHARE)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    maps = {}
    for f in a.maps:
        m = read_json(f)   # the tree keeps a large map.json as map.json.gz
        maps[str(m["config"]["seed"])] = m
    got = compare(maps, a.arm, share=a.share)
    f = lambda x: "none" if x is None else f"{x:g}"   # noqa: E731
    for r in got["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"seed {r['seed']} {r['cell']} TPOT {r['tpot']}: best fixed {f(r['best_fixed'])} "
              f"({','.join(r['best_arms']) or '-'}), {got['arm']} {f(r['arm'])} → {ratio} {'met' if r['met'] else 'MISSED'}")
    print(json.dumps(got["met"]))
    if a.out:
        a.out.write_text(json.dumps({**got, "command": " ".join(["python", "-m", "benchmarks.policies.map_seeds",
                                                                  *sys.argv[1:]])}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

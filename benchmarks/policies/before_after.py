"""One topology's sustained rate before and after a change, from ``real_policies`` runs.

Reads ``DIR/LABEL_sSEED/TOPOLOGY/requests.jsonl`` (``python -m benchmarks.policies.real_policies
--parts cpd --configs TOPOLOGY --seed SEED --out DIR/LABEL_sSEED``, once per label and seed) and
judges every rate's requests under two targets, each stated before measuring:

* ``ttft``: ``CLUSTER_TARGET`` (warm TTFT p90 ≤ 2 s, cold ≤ 20 s, 99% succeed), as the runs
  themselves judge;
* ``joint``: the same plus per-request TPOT p90 ≤ ``--tpot`` (default 0.1 s: ten tokens a second
  for each stream, 90% of requests attaining, as DistServe counts goodput).

Goodput per label and seed is the highest rate met with every lower rate met; the table gives
each seed and the median over seeds.

    python -m benchmarks.policies.before_after --dir benchmarks/results/cluster31 \\
        --labels before,after,fast --seeds 7,11,12 [--topology cpd-1d] [--tpot 0.1]

Writes ``DIR/before_after.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from warmpath.slo import CLUSTER_TARGET, Target

from benchmarks.common.results import read_jsonl, stored
from benchmarks.policies.ranking import goodputs, records, verdicts


def targets(tpot_s: float) -> dict[str, Target]:
    """The two targets: TTFT only, and TTFT with per-request TPOT p90 ≤ ``tpot_s``."""
    return {"ttft": CLUSTER_TARGET, "joint": Target.parse(f"{CLUSTER_TARGET.spec()},tpot_p90={tpot_s:g}")}


def judge_run(path: Path, duration_s: float, tgts: dict[str, Target]) -> dict:
    """Per rate of one run's ``requests.jsonl``: ``verdicts`` under each target; and per target
    the goodput."""
    by_rate: dict[float, list[dict]] = defaultdict(list)
    for row in read_jsonl(path):
        by_rate[float(row["rate"])].append(row)
    points = {r: verdicts(records(rows), duration_s, r, tgts) for r, rows in sorted(by_rate.items())}
    return {"points": points, "goodput": goodputs(points)}


def median_or_none(xs: list[float | None]) -> float | None:
    """The median, a run that met no rate counting as 0; None when no seed met any."""
    vals = [x or 0.0 for x in xs]
    return statistics.median(vals) if any(vals) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--labels", default="before,after")
    ap.add_argument("--seeds", default="7,11,12")
    ap.add_argument("--topology", default="cpd-1d")
    ap.add_argument("--duration", type=float, default=90.0, help="the runs' window per rate (s)")
    ap.add_argument("--tpot", type=float, default=0.1, help="the joint target's per-request TPOT p90 bound (s)")
    a = ap.parse_args(argv)
    tgts = targets(a.tpot)
    labels, seeds = a.labels.split(","), [int(s) for s in a.seeds.split(",")]
    out: dict = {"targets": {k: t.spec() for k, t in tgts.items()}, "runs": {}, "median": {}}
    for lab in labels:
        for s in seeds:
            path = a.dir / f"{lab}_s{s}" / a.topology / "requests.jsonl"
            if not stored(path):
                print(f"before_after: {path} not found (run real_policies with --out {path.parent.parent})",
                      file=sys.stderr)
                return 2
            out["runs"][f"{lab}_s{s}"] = judge_run(path, a.duration, tgts)
        out["median"][lab] = {t: median_or_none([out["runs"][f"{lab}_s{s}"]["goodput"][t] for s in seeds])
                              for t in tgts}
    fmt = lambda x: "none" if x is None else f"{x:g}"  # noqa: E731
    print(f"| {a.topology} | " + " | ".join(f"{t} goodput per seed {a.seeds} → median" for t in tgts) + " |")
    print("|---|" + "---|" * len(tgts))
    for lab in labels:
        cells = [" / ".join(fmt(out["runs"][f"{lab}_s{s}"]["goodput"][t]) for s in seeds)
                 + f" → **{fmt(out['median'][lab][t])}**" for t in tgts]
        print(f"| {lab} | " + " | ".join(cells) + " |")
    (a.dir / "before_after.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

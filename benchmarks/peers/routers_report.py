"""The routers comparison's verdicts (``benchmarks/peers/vllm_routers.py``'s output), judged again
from each run's ``requests.jsonl`` under several targets at once.

Targets (``slo.py``; >= 90% of the requests of every class attaining, >= 99% succeeding):

* ``joint``: issue 28's joint target, the one stated before measuring — warm TTFT p90 <= 2 s,
  cold TTFT p90 <= 20 s, per-request TPOT p90 <= 1.5x the unloaded TPOT (``routers.json``);
* ``joint-3x``: the same with 3x the unloaded TPOT (reported beside it, not a goal);
* ``ttft``: the TTFT bounds alone (``CLUSTER_TARGET``).

Goodput per router and seed: the highest offered rate met with every lower rate met
(``ranking.goodputs``); per router the median over seeds; beside it the prefix-cache hit rate
on the vLLM servers (their own counters, the run's deltas). Usage::

    python -m benchmarks.peers.routers_report benchmarks/results/peers/vllm_routers_r1 [LATER ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.common.results import read_json, read_jsonl
from benchmarks.policies.ranking import goodputs, joint_target, records, verdicts
from warmpath.slo import CLUSTER_TARGET, Target


def targets(unloaded_tpot_s: float) -> dict[str, Target]:
    """The three targets of this report, from the measured unloaded TPOT."""
    return {"joint": joint_target(unloaded_tpot_s), "joint-3x": joint_target(unloaded_tpot_s, 3.0),
            "ttft": CLUSTER_TARGET}


def judge_run(run_dir: Path, tgs: dict[str, Target]) -> dict[float, dict]:
    """Per offered rate of one router/seed: each target's verdict on its requests."""
    summary = read_json(run_dir / "summary.json")
    rows = read_jsonl(run_dir / "requests.jsonl")
    out = {}
    for key, run in summary["runs"].items():
        rate = float(key)
        recs = records([r for r in rows if r["rate"] == rate])
        out[rate] = verdicts(recs, run["duration_s"], rate, tgs)
    return out


def median_or_none(xs: list) -> float | None:
    """Median over seeds, a seed with no rate met counting as 0."""
    return statistics.median([x or 0.0 for x in xs]) if xs else None


def report(out: Path, more: tuple[Path, ...] = ()) -> dict:
    """Goodput per router, seed and target, the medians, the hit rates and each warmpath arm's
    (``warmpath``, ``warmpath-pd``) ratio to the better peer under each target. ``more``: folders of later runs (e.g. warmpath alone
    after a change) whose runs replace ``out``'s runs of the same routers; the target is
    ``out``'s (its unloaded TPOT)."""
    meta = read_json(out / "routers.json")
    tgs = targets(meta["unloaded_tpot_s"])
    runs = {(r["router"], r["seed"]): (out, r) for r in meta["runs"]}
    for m in more:
        later = read_json(m / "routers.json")["runs"]
        for r in list(runs):
            if r[0] in {x["router"] for x in later}:
                del runs[r]
        runs.update({(r["router"], r["seed"]): (m, r) for r in later})
    per: dict[str, dict] = {}
    for folder, run in runs.values():
        points = judge_run(folder / run["router"] / f"seed{run['seed']}", tgs)
        r = per.setdefault(run["router"], {"seeds": {}, "hit_rate": []})
        r["seeds"][run["seed"]] = {"goodput": goodputs(points), "points": points}
        r["hit_rate"].append(run["prefix_cache"]["hit_rate"])
    for r in per.values():
        r["median_goodput"] = {t: median_or_none([s["goodput"][t] for s in r["seeds"].values()]) for t in tgs}
        r["median_hit_rate"] = median_or_none(r["hit_rate"])
    ratio, arms = {}, {}
    for t in tgs:
        peers = [v["median_goodput"][t] for k, v in per.items() if not k.startswith("warmpath")]
        best = max(peers, default=None)
        for arm in (k for k in per if k.startswith("warmpath")):   # warmpath over replicas, over P/D
            mine = per[arm]["median_goodput"][t]
            arms.setdefault(arm, {})[t] = mine / best if mine is not None and best else None
        ratio[t] = arms.get("warmpath", {}).get(t)
    return {"targets": {k: v.spec() for k, v in tgs.items()}, "unloaded_tpot_s": meta["unloaded_tpot_s"],
            "routers": per, "warmpath_vs_best_peer": ratio, "warmpath_arms_vs_best_peer": arms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the folder vllm_routers wrote (routers.json)")
    ap.add_argument("more", type=Path, nargs="*", help="later runs replacing their routers' runs in OUT")
    a = ap.parse_args()
    rep = report(a.out, tuple(a.more))
    (a.out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    print(f"targets: {rep['targets']}")
    for name, r in rep["routers"].items():
        per_seed = {s: v["goodput"] for s, v in r["seeds"].items()}
        print(f"{name:12s} median goodput {r['median_goodput']}  hit rate median {r['median_hit_rate']:.3f}  "
              f"per seed {per_seed}")
    for arm, r in rep["warmpath_arms_vs_best_peer"].items():
        print(f"{arm} / best peer: {r}")


if __name__ == "__main__":
    main()

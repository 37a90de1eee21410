"""``warmpath plan``'s ranking of topologies against the real cluster's (issue 15's check).

The real side: ``benchmarks/policies/real_policies.py --parts cpd`` runs of the same 3 workers (1 thread each,
real Mooncake, the coding-agent workload of ``real_policies.py``, 90 s per rate): r1
(``policies_real`` + ``policies_real_replica``, rates 0.1/0.15/0.25), r2 (0.15/0.2/0.25), r3
(0.15..0.3), all seed 7, and r4 (seed 11, 0.15/0.2/0.25). The four warmpath topologies measured
(the peer routers cannot be simulated): ``cpd-1d``, ``cpd-1d@dynamic``, ``pd-2p1d+pd-kv``,
``replica-3``. SLO (``real_policies.py``'s): warm TTFT p90 <= 2 s, cold TTFT p90 <= 20 s, >= 99% succeed.

The ranking rule, fixed from the real runs alone, before the simulator was asked:

1. the grid is G = {0.15, 0.2, 0.25} sessions/s (0.1 is in r1 only, 0.3 in r3 only: ignored);
2. a run's sustained rate: the highest rate of G it measured that met the SLO with every
   lower rate of G it measured meeting it too (0 if 0.15 missed); key 1: the **median over
   runs** of it, higher first;
3. key 2 (the runs tie at 0.15 often): the **pass share**, points of G that met the SLO over
   points of G measured, over all runs, higher first;
4. key 3: the mean over runs of the headroom at 0.25, max(warm p90 / 2, cold p90 / 20),
   lower first.

The simulator's side is ``warmpath plan``'s: its candidates for 3 GPUs of TP 1 (PPD on CPD
splits and the ``pd-kv`` policy included, ``plan_space.candidates``), each point a
``plan_eval.SimEvaluator`` call on the validated CPU profile (``sim_validation.cpu_profile``:
the step model of ``calibration_insitu.json``, the scatter of ``calibration_traced.json``, 2
shared cores, 0.5 GiB L1 + 0.5 GiB L2 per worker, the measured overheads), the same workload,
priming, per-class SLO and seeds (arrivals: the run's seed, sessions: seed + 1000 × rate), PPD
``dynamic`` without a table (as the real router ran it). Every real run is mirrored by
``--replicas`` simulated ones (other seeds of the step scatter) at the rates it measured, each
rate on a fresh primed cluster (``plan``: mode ``plan``) and, as a check of that shortcut, the
rates in the run's order on one cluster whose caches carry over (what the real runs did,
``sim_validation.simulate_sweep``: mode ``sequential``). Both are ranked by the rule above and
compared with the real ranking (Kendall tau, exact order). ``plan()`` itself also runs over
every 3-GPU candidate (no screen, grid G / 3 per GPU) per workload seed: its recommendation.

    python -m benchmarks.sim_accuracy.plan_vs_real [--replicas 5] [--out benchmarks/results/plan_vs_real]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from itertools import combinations
from pathlib import Path

from benchmarks.common import workload as real  # the workload of the real runs
from benchmarks.common.results import read_json, stored
from benchmarks.sim_accuracy import sim_validation as val  # the validated CPU profile

from warmpath.plan.search import PlanConfig, plan
from warmpath.plan.evaluate import SimEvaluator
from warmpath.plan.space import candidates

GRID = (0.15, 0.2, 0.25)
TARGET = real.TARGET                 # slo.CLUSTER_TARGET, as cluster.py's runs
SLO = real.SLO                       # its TTFT p90 bound per class
RES = Path("benchmarks/results")
# real config -> plan's candidate (3 GPUs, TP 1)
CONFIGS = {"cpd-1d": "cpd 1pp+1p+1d tp1", "cpd-1d@dynamic": "cpd 1pp+1p+1d tp1 ppd-dynamic",
           "pd-2p1d+pd-kv": "pd 2p+1d tp1 pd-kv", "replica-3": "replica 3r tp1"}
# run -> (folder with cluster.json, {config: summary folder} where not folder/config)
RUNS = {"r1": ("policies_real", {"replica-3": "policies_real_replica/benchmarks/topologies/replica-3.json"}),
        "r2": ("policies_real_r2", {}), "r3": ("policies_real_r3", {}), "r4": ("policies_real_r4", {})}


def headroom(warm: float | None, cold: float | None) -> float:
    """The SLO's tightest class: max(warm p90 / 2 s, cold p90 / 20 s)."""
    return max((warm or 0.0) / SLO["warm"], (cold or 0.0) / SLO["cold"])


def load_real(res: Path = RES) -> dict:
    """{run: {"seed", "rates": the run's order, "configs": {config: {rate: point}}}}; a point:
    met (``real_policies.py``'s verdict), warm / cold TTFT p90, headroom."""
    out = {}
    for run, (folder, where) in RUNS.items():
        cmd = json.loads((res / folder / "cluster.json").read_text())["command"]
        m = re.search(r"--seed (\d+)", cmd)
        rates = [float(x) for x in re.search(r"--rates (\S+)", cmd).group(1).split(",")]
        cfgs = {}
        for cfg in CONFIGS:
            path = res / where.get(cfg, f"{folder}/{cfg}") / "summary.json"
            if not stored(path):   # kept plain or gzipped
                continue
            s = read_json(path)
            cfgs[cfg] = {float(r): point(s["runs"][r]["meets_slo"], s["rates"][r]) for r in s["rates"]}
        out[run] = {"seed": int(m.group(1)) if m else real.SEED, "rates": rates, "configs": cfgs}
    return out


def point(met: bool, classes: dict) -> dict:
    w, c = classes["warm"]["ttft_p90_s"], classes["cold"]["ttft_p90_s"]
    return {"met": bool(met), "warm_p90_s": w, "cold_p90_s": c, "headroom": headroom(w, c)}


def sustained(points: dict) -> float:
    """The highest rate of GRID measured that met the SLO with every lower measured one met."""
    best = 0.0
    for r in sorted(x for x in points if x in GRID):
        if not points[r]["met"]:
            break
        best = r
    return best


def score(runs: list[dict]) -> dict:
    """The rule's three keys over a config's runs ({rate: point} each)."""
    pts = [p for run in runs for r, p in run.items() if r in GRID]
    heads = [run[0.25]["headroom"] for run in runs if 0.25 in run]
    return {"runs": len(runs), "sustained": [sustained(r) for r in runs],
            "median_sustained": statistics.median(sustained(r) for r in runs),
            "pass_share": sum(p["met"] for p in pts) / len(pts),
            "mean_headroom_025": statistics.fmean(heads) if heads else None,
            "met_share_by_rate": {str(x): share([run[x]["met"] for run in runs if x in run]) for x in GRID}}


def share(xs: list[bool]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def ranking(scores: dict) -> list[str]:
    """Configs by the rule: median sustained, then pass share (both higher first), then headroom."""
    return sorted(scores, key=lambda c: (-scores[c]["median_sustained"], -scores[c]["pass_share"],
                                         scores[c]["mean_headroom_025"] or 0.0, c))


def kendall_tau(a: list[str], b: list[str]) -> float:
    """Kendall's tau between two orders of the same items (no ties): (concordant - discordant) / pairs."""
    pos = {x: i for i, x in enumerate(b)}
    pairs = list(combinations(a, 2))
    return sum(1 if pos[x] < pos[y] else -1 for x, y in pairs) / len(pairs)


def evaluator(prof, seed: int, workload_seed: int) -> SimEvaluator:
    """``plan``'s evaluator mirroring ``real_policies.py``: primed, seeded, per-class SLO, 90 s."""
    fitted, hw, extra, _ = prof
    return SimEvaluator(val.cluster_setup("cpd-1d", fitted, hw, extra), TARGET, make=real.agent, duration_s=90.0,
                        seed=seed, prime=val.primes, workload_seed=workload_seed,
                        roofline_ppd=False)


def plan_candidates() -> dict:
    """Every candidate ``warmpath plan`` tries on 3 GPUs of TP 1, PPD on PD and CPD, pd-kv too."""
    return {c.name: c for c in candidates(3, (1,), ppd_modes=("off", "dynamic"), ppd_kinds=("pd", "cpd"),
                                           pd_policies=("pd", "pd-kv"))}


def simulate(real_runs: dict, prof, replicas: int, mode: str) -> dict:
    """{config: {run: [{rate: point}, ...]}}: ``replicas`` simulated runs per real run (step
    scatter seeds i * replicas + j), at the rates that run measured."""
    cands = plan_candidates()
    out: dict = {c: {} for c in CONFIGS}
    for i, (run, r) in enumerate(real_runs.items()):
        for cfg, pts in r["configs"].items():
            cand = cands[CONFIGS[cfg]]
            got_runs = out[cfg][run] = []
            for j in range(replicas):
                seed = i * replicas + j
                if mode == "plan":
                    ev = evaluator(prof, seed, r["seed"])
                    got = {x: ev(cand, x / cand.gpus, True) for x in pts}
                    got_runs.append({x: point(g["slo_met"], {c: {"ttft_p90_s": g[f"{c}_ttft_p90_s"]} for c in SLO})
                                     for x, g in got.items()})
                else:
                    setup = evaluator(prof, seed, r["seed"]).setup(cand)
                    cl = val.simulate_sweep(setup, r["rates"], 90.0, r["seed"])
                    got_runs.append({x: point(real.meets(cl[x]), cl[x]) for x in pts})
    return out


def points(real_runs: dict, sims: dict) -> list[dict]:
    """Every real point of GRID beside its simulations: met, warm / cold TTFT p90 (sim: the
    share met and the medians)."""
    rows = []
    for cfg, by_run in sims.items():
        for run, reps in by_run.items():
            for x, p in sorted(real_runs[run]["configs"][cfg].items()):
                if x not in GRID:
                    continue
                med = {k: statistics.median(r[x][k] or 0.0 for r in reps) for k in ("warm_p90_s", "cold_p90_s")}
                rows.append({"config": cfg, "run": run, "rate": x, "real_met": p["met"],
                             "real_warm_p90_s": p["warm_p90_s"], "real_cold_p90_s": p["cold_p90_s"],
                             "sim_met_share": share([r[x]["met"] for r in reps]),
                             "sim_warm_p90_s": med["warm_p90_s"], "sim_cold_p90_s": med["cold_p90_s"]})
    return rows


def compare(real_rank: list[str], sim_rank: list[str]) -> dict:
    pos = {x: i for i, x in enumerate(sim_rank)}
    pairs = [{"pair": [x, y], "agree": pos[x] < pos[y]} for x, y in combinations(real_rank, 2)]
    return {"kendall_tau": kendall_tau(real_rank, sim_rank), "exact": real_rank == sim_rank,
            "top_matches": real_rank[0] == sim_rank[0], "pairs": pairs}


def plan_all(prof, workload_seed: int) -> dict:
    """``plan()`` over every 3-GPU candidate, grid G per GPU, no screen, mirroring the real runs."""
    cfg = PlanConfig(3, tuple(x / 3 for x in GRID), tp_set=(1,), ppd_modes=("off", "dynamic"), screen_requests=0,
                     bisect=0, seed=0, ppd_kinds=("pd", "cpd"), pd_policies=("pd", "pd-kv"))
    res = plan(list(plan_candidates().values()), evaluator(prof, 0, workload_seed), cfg, "sessions/s",
               say=lambda m: None)
    return {"recommended": res["recommended"], "runner_up": res["runner_up"],
            "rows": [{k: r[k] for k in ("candidate", "sustained_rate", "headroom")} for r in res["rows"]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=5, help="simulated runs per real run (step scatter seeds)")
    p.add_argument("--out", type=Path, default=RES / "plan_vs_real")
    a = p.parse_args()
    runs = load_real()
    real_scores = {c: score([r["configs"][c] for r in runs.values() if c in r["configs"]]) for c in CONFIGS}
    real_rank = ranking(real_scores)
    prof = val.cpu_profile(RES / "cluster/calibration_insitu.json", RES / "cluster/calibration_traced.json",
                           RES / "request_overhead.json", RES / "answer_retokenize.json")
    out = {"command": " ".join(["python", *sys.argv]), "rule": __doc__.split("The ranking rule")[1].split(
        "The simulator")[0].strip(), "grid": GRID, "slo": SLO, "candidates": CONFIGS,
        "real": {"runs": {k: {"seed": v["seed"], "rates": v["rates"]} for k, v in runs.items()},
                 "scores": real_scores, "ranking": real_rank}}
    print("real:", " > ".join(real_rank))
    for c in real_rank:
        s = real_scores[c]
        print(f"  {c}: median sustained {s['median_sustained']} {s['sustained']}, pass share "
              f"{s['pass_share']:.3f}, headroom@0.25 {s['mean_headroom_025']:.2f}, met by rate {s['met_share_by_rate']}")
    for mode in ("plan", "sequential"):
        sims = simulate(runs, prof, a.replicas, mode)
        scores = {c: score([r for reps in v.values() for r in reps]) for c, v in sims.items()}
        rank = ranking(scores)
        pts = points(runs, sims)
        out[mode] = {"scores": scores, "ranking": rank, **compare(real_rank, rank), "points": pts}
        wrong = [p for p in pts if p["real_met"] != (p["sim_met_share"] >= 0.5)]
        print(f"simulated ({mode}, {a.replicas} per real run):", " > ".join(rank),
              f"| Kendall tau {out[mode]['kendall_tau']:.2f}, exact {out[mode]['exact']}")
        for c in rank:
            s = scores[c]
            print(f"  {c}: median sustained {s['median_sustained']}, pass share {s['pass_share']:.3f}, "
                  f"headroom@0.25 {s['mean_headroom_025']:.2f}, met by rate {s['met_share_by_rate']}")
        print(f"  {len(wrong)} of {len(pts)} real points where most simulations disagree:")
        for p in wrong:
            print(f"    {p['config']} {p['run']} {p['rate']}: real {'met' if p['real_met'] else 'missed'} (warm "
                  f"{p['real_warm_p90_s']:.2f} / cold {p['real_cold_p90_s']:.1f} s), sim met {p['sim_met_share']:.0%} "
                  f"(warm {p['sim_warm_p90_s']:.2f} / cold {p['sim_cold_p90_s']:.1f} s)")
    out["plan_all"] = {str(s): plan_all(prof, s) for s in sorted({r["seed"] for r in runs.values()})}
    for s, r in out["plan_all"].items():
        print(f"plan() over {len(r['rows'])} candidates, workload seed {s}: recommended {r['recommended']}, "
              f"runner-up {r['runner_up']}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "plan_vs_real.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out / 'plan_vs_real.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

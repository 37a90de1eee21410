"""What the ranking's parts (``ranking.py`` real, ``ranking_sim.py`` simulated, ``ranking_plan.py``)
share below them: the joint target, the verdicts of a run's requests under each target, the
goodput they give, and the run's extra worker flags (``--worker-arg``), which the real arms'
workers get and the simulated ones model. The peers' reports judge their runs with the same
verdicts (``benchmarks/peers/routers_report.py``, ``vs_vllm.py``)."""

from __future__ import annotations

from warmpath.bench.metrics import Record
from warmpath.bench.sweep import judge
from warmpath.slo import Target

TPOT_FACTOR = 1.5

WORKER_ARGS: list[str] = []   # --worker-arg: extra engine flags for every arm's workers


def joint_target(unloaded_tpot_s: float, factor: float = TPOT_FACTOR) -> Target:
    """The joint target: ``CLUSTER_TARGET``'s TTFT bounds plus TPOT p90 <= ``factor`` (1.5) x unloaded."""
    return Target.parse(f"warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90={factor * unloaded_tpot_s:.4f}")


def records(rows: list[dict]) -> list[Record]:
    """``requests.jsonl`` rows back into the bench's records (enough for a target's verdict)."""
    return [Record(r["sid"], r["turn"], r["class"], r["ok"], r["ttft_s"], r["e2e_s"], r["output_tokens"],
                   r["prompt_tokens"], r["cached_tokens"], error=r["error"]) for r in rows]


def verdicts(recs: list[Record], duration_s: float, rate: float, targets: dict[str, Target]) -> dict:
    """Per target: met (``Target.met``), attainment and the TTFT / TPOT p90s by class."""
    out = {}
    for name, t in targets.items():
        j = judge(recs, duration_s, t, rate)
        cl = j["classes"]
        out[name] = {"met": j["slo_met"], "attainment": {c: cl[c]["attainment"] for c in ("warm", "cold")},
                     "warm_ttft_p90_s": cl["warm"]["ttft_p90_s"], "cold_ttft_p90_s": cl["cold"]["ttft_p90_s"],
                     "tpot_p90_s": cl["all"]["tpot_p90_s"], "success": cl["all"]["success_rate"]}
    return out


def goodputs(points: dict[float, dict]) -> dict[str, float | None]:
    """Per target: the highest rate met with every lower rate met."""
    names = next(iter(points.values())).keys() if points else []
    out = {}
    for n in names:
        best = None
        for r in sorted(points):
            if not points[r][n]["met"]:
                break
            best = r
        out[n] = best
    return out


"""``warmpath plan``: the best topology for a GPU budget, searched in the simulator (no torch).

Every candidate of ``plan_space.py`` is swept up a shared ascending grid of loads (a trace:
multiples of its own arrival rate, ``bench/replay.py``; a workload: sessions/s per GPU) until
a load misses the SLO; its sustained load is the highest that met it with every lower one
meeting it too (``bench/sweep.max_rate_from_sweep``). A run stops as soon as it can no longer
meet the SLO (``bench/metrics.SLOMissWatch``). To stay fast on a large trace the search has
two stages: every candidate on a screening sample (the trace's first requests, or a shorter
workload), then the best ``finalists`` on the whole of it, with ``bisect`` bisection steps
(``bench/sweep.search_max_rate``) between the last load met and the first missed. The
recommendation is the finalist with the highest sustained load per GPU (ties: the most
headroom under the SLO at that load), the runner-up the next.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable

from warmpath.bench.sweep import max_rate_from_sweep, search_max_rate
from warmpath.launch.topology import PPD_MODES
from warmpath.plan.space import KINDS, PD_POLICIES, Candidate

# (candidate, load, whole: the full trace / duration, else the screening sample) -> a point:
# {"rate": cluster requests (sessions)/s, "slo_met", "ttft_p90_s", "tpot_s", "success_rate", "headroom", ...}
Evaluate = Callable[[Candidate, float, bool], dict]


@dataclass(frozen=True)
class PlanConfig:
    """The search. ``grid``: ascending loads (a trace: × its own rate; a workload: sessions/s
    per GPU). ``min_gpus``: smallest deployment tried (default ``gpus``: all of them).
    ``screen_requests`` / ``screen_duration_s``: the screening sample of a trace / workload (0:
    no screening stage, every candidate on the whole load with bisection). ``ppd_kinds``: the
    kinds PPD modes are tried on (``pd``, ``cpd``); ``pd_policies``: PD routing policies tried
    on PD splits (``pd``, ``pd-kv``)."""

    gpus: int
    grid: tuple[float, ...]
    min_gpus: int | None = None
    tp_set: tuple[int, ...] = (1, 2, 4, 8)
    kinds: tuple[str, ...] = KINDS
    ppd_modes: tuple[str, ...] = ("off", "x1", "dynamic")
    screen_requests: int = 400
    screen_duration_s: float = 30.0
    finalists: int = 2
    bisect: int = 2
    jobs: int = 1
    seed: int = 0
    ppd_kinds: tuple[str, ...] = ("pd",)
    pd_policies: tuple[str, ...] = ("pd",)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"--gpus must be >= 1, got {self.gpus}")
        if self.min_gpus is not None and not 1 <= self.min_gpus <= self.gpus:
            raise ValueError(f"--min-gpus must be in [1, --gpus={self.gpus}], got {self.min_gpus}")
        if not self.grid or any(x <= 0 for x in self.grid) or list(self.grid) != sorted(set(self.grid)):
            raise ValueError(f"--grid must be loads > 0 in ascending order, got {list(self.grid)}")
        if not self.tp_set or any(t < 1 for t in self.tp_set):
            raise ValueError(f"--tp-set must be GPU counts >= 1, got {list(self.tp_set)}")
        if not self.kinds or set(self.kinds) - set(KINDS):
            raise ValueError(f"--kinds must be among {', '.join(KINDS)}, got {list(self.kinds)}")
        if "replica" not in self.kinds:    # replicas are in every comparison (issue 28)
            object.__setattr__(self, "kinds", ("replica", *self.kinds))
        if not self.ppd_modes or set(self.ppd_modes) - set(PPD_MODES):
            raise ValueError(f"--ppd-modes must be among {', '.join(PPD_MODES)}, got {list(self.ppd_modes)}")
        if set(self.ppd_kinds) - {"pd", "cpd"}:
            raise ValueError(f"--ppd-kinds must be among pd, cpd, got {list(self.ppd_kinds)}")
        if not self.pd_policies or set(self.pd_policies) - set(PD_POLICIES):
            raise ValueError(f"--pd-policies must be among {', '.join(PD_POLICIES)}, got {list(self.pd_policies)}")
        if self.screen_requests < 0 or self.screen_duration_s < 0:
            raise ValueError("--screen-requests and --screen-duration must be >= 0")
        if self.finalists < 1 or self.bisect < 0 or self.jobs < 1:
            raise ValueError(f"--finalists and --jobs must be >= 1 and --bisect >= 0, got "
                             f"{self.finalists}, {self.jobs}, {self.bisect}")


def search_load(at: Callable[[float], dict], grid: tuple[float, ...], bisect: int) -> tuple[float | None, dict]:
    """The highest sustained load: ``at(load)`` up the grid until one misses the SLO, then
    ``bisect`` steps between the last met and the first missed; every point is kept."""
    runs: dict[float, dict] = {}
    for x in grid:
        runs[x] = at(x)
        if not runs[x]["slo_met"]:
            break
    best = max_rate_from_sweep(runs)
    missed = [x for x, r in runs.items() if not r["slo_met"]]
    if bisect and best is not None and missed:
        async def met(x: float) -> bool:
            if x not in runs:
                runs[x] = at(x)
            return runs[x]["slo_met"]
        asyncio.run(search_max_rate(met, best, min(missed), bisect))
    return max_rate_from_sweep(runs), runs


def sweep_candidate(evaluate: Evaluate, cand: Candidate, grid: tuple[float, ...], whole: bool, bisect: int) -> dict:
    """One table row: the candidate's sustained load, its rate per GPU and every point tried."""
    t0, c0 = time.perf_counter(), time.process_time()
    best, runs = search_load(lambda x: evaluate(cand, x, whole), grid, bisect)
    at = runs.get(best, {}) if best is not None else {}
    rate = at.get("rate")
    return {"candidate": cand.name, "kind": cand.kind, "policy": cand.topology().policy, "gpus": cand.gpus,
            "workers": dict(zip(cand.roles, cand.counts)), "tp": cand.tp, "ppd": cand.ppd,
            "stage": "full" if whole else "screen", "sustained_load": best, "sustained_rate": rate,
            "per_gpu": None if rate is None else rate / cand.gpus, "headroom": at.get("headroom"),
            "ttft_p90_s": at.get("ttft_p90_s"), "tpot_s": at.get("tpot_s"),
            "all_grid_met": best is not None and best == grid[-1] and len(runs) >= len(grid),
            "points": [{"load": x, **{k: v for k, v in runs[x].items()}} for x in sorted(runs)],
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def rank_key(row: dict) -> tuple:
    """Highest sustained load per GPU first; then the most headroom; then the name."""
    per = row["per_gpu"]
    head = row["headroom"]
    return (per is None, -(per or 0.0), float("inf") if head is None else head, row["candidate"])


_CTX: dict = {}   # the evaluator, inherited by forked workers (never pickled)


def _task(i: int, cand: Candidate, grid: tuple, whole: bool, bisect: int) -> tuple[int, dict]:
    return i, sweep_candidate(_CTX["evaluate"], cand, grid, whole, bisect)


def _stage(label: str, cands: list[Candidate], evaluate: Evaluate, cfg: PlanConfig, whole: bool, bisect: int,
           say: Callable[[str], object], unit: str) -> list[dict]:
    rows: list[dict | None] = [None] * len(cands)
    done = 0

    def shown(i: int, row: dict) -> None:
        nonlocal done
        rows[i], done = row, done + 1
        per = "missed the lowest load" if row["per_gpu"] is None else f"{row['per_gpu']:.3g} {unit}/GPU"
        say(f"[{label} {done}/{len(cands)}] {row['candidate']}: {per} ({row['wall_s']:.1f} s, "
            f"{row['cpu_s']:.1f} s CPU)")

    if cfg.jobs == 1 or len(cands) == 1:
        for i, c in enumerate(cands):
            shown(i, sweep_candidate(evaluate, c, cfg.grid, whole, bisect))
        return rows
    _CTX["evaluate"] = evaluate
    with ProcessPoolExecutor(min(cfg.jobs, len(cands)), mp_context=multiprocessing.get_context("fork")) as pool:
        futs = [pool.submit(_task, i, c, cfg.grid, whole, bisect) for i, c in enumerate(cands)]
        for f in as_completed(futs):
            shown(*f.result())
    return rows


def plan(cands: list[Candidate], evaluate: Evaluate, cfg: PlanConfig, unit: str = "req/s",
         say: Callable[[str], object] = lambda m: print(m, file=sys.stderr, flush=True)) -> dict:
    """Search ``cands``; rows ranked (finalists, on the whole load, before the screened rest),
    the recommendation and the runner-up (``None`` where no finalist met the lowest load)."""
    if not cands:
        raise ValueError(f"no topology fits {cfg.gpus} GPUs with TP from {list(cfg.tp_set)} "
                         f"(does the model fit? try a larger --tp-set or --gpus)")
    t0 = time.perf_counter()
    screened = cfg.screen_requests > 0 and cfg.screen_duration_s > 0
    if not screened:
        rows = sorted(_stage("full", cands, evaluate, cfg, True, cfg.bisect, say, unit), key=rank_key)
        finals, rest = rows, []
    else:
        first = sorted(_stage("screen", cands, evaluate, cfg, False, 0, say, unit), key=rank_key)
        top = first[:cfg.finalists]
        by_name = {c.name: c for c in cands}
        finals = sorted(_stage("full", [by_name[r["candidate"]] for r in top], evaluate, cfg, True, cfg.bisect,
                               say, unit), key=rank_key)
        screen_of = {r["candidate"]: r for r in top}
        for f in finals:   # what the screen said of it, beside what the whole load says
            s = screen_of[f["candidate"]]
            f["screen"] = {"per_gpu": s["per_gpu"], "points": len(s["points"]), "wall_s": s["wall_s"],
                           "cpu_s": s["cpu_s"]}
        rest = first[cfg.finalists:]
        rows = finals + rest
    ok = [r for r in finals if r["per_gpu"] is not None]
    sims = sum(len(r["points"]) + r.get("screen", {}).get("points", 0) for r in rows)
    cpu = sum(r["cpu_s"] + r.get("screen", {}).get("cpu_s", 0.0) for r in rows)
    return {"rows": rows, "recommended": ok[0]["candidate"] if ok else None,
            "runner_up": ok[1]["candidate"] if len(ok) > 1 else None,
            "candidates": len(cands), "finalists": [r["candidate"] for r in finals],
            "simulations": sims, "search_cpu_s": cpu, "wall_s": time.perf_counter() - t0}

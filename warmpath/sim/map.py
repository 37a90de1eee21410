"""``warmpath map cpd|ppd``: where CPD and PPD pay off — a grid of simulated workloads and
clusters, drawn as facets of heatmaps (``sim/map_plot.py``) plus ``map.json``.

* ``cpd``: CPD's sustained rate over PD's and over ``pd-kv``'s (the KV-aware single pool)
  across answer length (facet rows) × P:D split (facet columns) × cold share (y) × cold
  document length (x). Sustained is :func:`~warmpath.bench.sweep.max_rate_from_sweep` of the
  rate grid under the repro's SLO; the cluster and workload are ``warmpath repro cpd``'s.
* ``ppd``: turn-2+ TTFT p50 of x=0 over dynamic's and over x=1's across link speed (rows) ×
  load (columns) × history length (y) × append length (x), on ``warmpath repro ppd``'s cluster.

A gain above 1 favours CPD / PPD. The seed's operating point is outlined on its nearest cell.
"""

from __future__ import annotations

import itertools
import math
import random
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from warmpath.bench.sweep import max_rate_from_sweep
from warmpath.bench.targets import CPD_TARGET
from warmpath.bench.workload import PPD_FIRST, PPD_FOLLOW, Session, Turn, coding_agent, fast_tokens
from warmpath.launch.topology import Topology
from warmpath.sim.map_cache import append, load_cache, open_cache, task_key
from warmpath.sim.hardware import HARDWARE
from warmpath.sim.repro import CPD_CONFIGS, CPD_WORKLOAD, PPD_RATES, cpd_setup, ppd_setup
from warmpath.sim.run import simulate_rate

GPUS_PER_NODE = 4                   # the blog's nodes: one TP4 prefill-type worker or four TP1 decoders
CPD_SLO = CPD_TARGET                # warmpath repro cpd's (bench/targets.py)
DIMS = {"cpd": ("answer", "split", "cold_share", "cold_tokens"),       # facet row, facet column, y, x
        "ppd": ("link_gbps", "load", "history", "append")}
COMPARISONS = {"cpd": {"cpd_vs_pd": ("cpd", "pd"), "cpd_vs_pd-kv": ("cpd", "pd-kv")},
               "ppd": {"dynamic_vs_x0": ("dynamic", "x0"), "x1_vs_x0": ("x1", "x0")}}
_SPLIT = re.compile(r"(\d+)P(\d+)D")


@dataclass(frozen=True)
class MapConfig:
    """One map. CPD: ``rates`` are target sessions/s per GPU (the repro's QPS/GPU), ascending;
    splits ``"<p>P<d>D"`` count 4-GPU nodes (CPD: ``p // 2`` pre-prefill + the rest prefill);
    ``context_tokens`` is the warm repositories' shared context. PPD: a session is a turn of
    ``history - answer`` new tokens and its ``answer``, then an append and another ``answer``;
    ``loads`` are sessions/s on the ``ppd_split`` cluster (TP1 workers)."""

    kind: str = "cpd"
    cold_shares: tuple = (0.2, 0.5)
    cold_tokens: tuple = (16384, 65536)
    answers: tuple = (128, 512)
    splits: tuple = ("2P1D", "2P2D")
    rates: tuple = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
    context_tokens: int = 65536
    max_in_flight: int | None = None   # router admission limit (None: sized to the fleet)
    kv_blocks: int | None = None    # L1 blocks per worker (default: the GPUs' memory, capped as in SimSetup)
    histories: tuple = (512, 2048, 8192)
    appends: tuple = (64, 256, 1024)
    links_gbps: tuple = (50.0, 400.0)
    loads: tuple = (4.0, 12.0)
    ppd_split: str = "2P2D"
    ppd_answer: int = 128
    duration_s: float = 20.0
    ramp_s: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in DIMS:
            raise ValueError(f"map: kind must be one of {sorted(DIMS)}, got {self.kind!r}")
        for name in ("cold_shares", "cold_tokens", "answers", "splits", "rates", "histories", "appends",
                     "links_gbps", "loads"):
            v = getattr(self, name)
            if not v or len(set(v)) != len(v):
                raise ValueError(f"map: {name} must be non-empty without repeats, got {v!r}")
        for name in ("cold_tokens", "answers", "rates", "histories", "appends", "links_gbps", "loads"):
            if any(not x > 0 for x in getattr(self, name)):
                raise ValueError(f"map: {name} must all be > 0, got {getattr(self, name)!r}")
        if any(not 0 <= x < 1 for x in self.cold_shares):
            raise ValueError(f"map: cold_shares must be in [0, 1), got {self.cold_shares!r}")
        if list(self.rates) != sorted(self.rates):
            raise ValueError(f"map: rates must be ascending (sustained is read from the lowest up), got {self.rates}")
        if any(parse_split(s)[0] < 2 for s in self.splits):
            raise ValueError(f"map: CPD needs >= 2 prefill nodes (pre-prefill + prefill), got {self.splits}")
        parse_split(self.ppd_split)
        if self.ppd_answer < 1 or min(self.histories) <= self.ppd_answer:
            raise ValueError(f"map: every history must exceed ppd_answer ({self.ppd_answer}), got {self.histories}")
        if min(self.context_tokens, *(1 if v is None else v for v in (self.max_in_flight, self.kv_blocks))) < 1 \
                or self.duration_s <= 0 or self.ramp_s < 0:
            raise ValueError("map: context_tokens, max_in_flight, kv_blocks, duration_s must be > 0, ramp_s >= 0")

    def axes(self) -> dict[str, tuple]:
        """Dimension → its values, in facet-row, facet-column, y, x order."""
        values = {"answer": self.answers, "split": self.splits, "cold_share": self.cold_shares,
                  "cold_tokens": self.cold_tokens, "link_gbps": self.links_gbps, "load": self.loads,
                  "history": self.histories, "append": self.appends}
        return {d: tuple(values[d]) for d in DIMS[self.kind]}


def quick(kind: str, seed: int = 0) -> MapConfig:
    """A tiny map to check the plumbing (tests): one facet of 2 cells, 2K-token prompts,
    small KV pools, a few seconds per rate, CPD admitting 4 at a time (so the top rate fails)."""
    return MapConfig(kind, cold_shares=(0.2, 0.5), cold_tokens=(2048,), answers=(32,), splits=("2P1D",),
                     rates=(1.0, 4.0), context_tokens=2048, kv_blocks=1024, max_in_flight=4, histories=(512, 2048),
                     appends=(256,), links_gbps=(25.0,), loads=(8.0,), ppd_answer=32,
                     duration_s=2.0 if kind == "cpd" else 3.0, ramp_s=0.0, seed=seed)


def parse_split(spec: str) -> tuple[int, int]:
    """``"2P1D"`` → (2, 1) nodes."""
    m = _SPLIT.fullmatch(spec)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"map: a split is <p>P<d>D with p, d >= 1, got {spec!r}")
    return int(m[1]), int(m[2])


def grid(cfg: MapConfig) -> list[dict]:
    """Every cell, row-major over the facet rows, facet columns, y, then x."""
    axes = cfg.axes()
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


def cpd_topology(split: str, policy: str) -> Topology:
    """The split's nodes as workers: prefill-type TP4 (one per node), decoders four per node."""
    p, d = parse_split(split)
    roles = {"pre-prefill": p // 2, "prefill": p - p // 2} if policy == "cpd" else {"prefill": p}
    return Topology(f"{split}-{policy}", policy, {**roles, "decode": d * GPUS_PER_NODE})


def sustained_gain(new: float | None, base: float | None, rates: tuple) -> dict:
    """``new / base`` of two sustained rates on the grid ``rates``, with what the grid allows
    to say: ``"="`` both inside it; ``">"`` / ``"<"`` when the baseline / the new one sustains
    not even the lowest rate (the ratio to the lowest rate is then a bound); ``">="`` /
    ``"<="`` when one sustained the highest rate (it may go higher); ``None`` when neither
    sustains the lowest rate or both sustain the highest."""
    lo, hi = min(rates), max(rates)
    if new is None and base is None:
        return {"value": None, "bound": "n/a", "note": f"neither sustains the lowest rate {lo}"}
    if base is None:
        return {"value": new / lo, "bound": ">", "note": f"baseline sustains not even {lo}"}
    if new is None:
        return {"value": lo / base, "bound": "<", "note": f"not even {lo} sustained"}
    if new == hi and base == hi:
        return {"value": None, "bound": "n/a", "note": f"both sustain the highest rate {hi}"}
    bound = ">=" if new == hi else "<=" if base == hi else "="
    return {"value": new / base, "bound": bound, "note": ""}


def ttft_gain(new: float | None, base: float | None) -> dict:
    """Baseline TTFT over the new one (above 1: the new mode answers sooner)."""
    if not new or base is None:
        return {"value": None, "bound": "n/a", "note": "no turn-2+ TTFT"}
    return {"value": base / new, "bound": "=", "note": ""}


def operating_point(cfg: MapConfig) -> dict:
    """The seed's point (CPD blog / PPD paper as ``warmpath repro`` assumes it) and the cell
    nearest to it: per dimension the closest value (shares linearly, lengths, rates and
    speeds on a log scale, splits by their P:D GPU ratio; ties to the first)."""
    if cfg.kind == "cpd":
        w = CPD_CONFIGS["2P1D"].workers
        point = {"answer": CPD_WORKLOAD["answer"], "split": f"{w['prefill']}P{w['decode'] // GPUS_PER_NODE}D",
                 "cold_share": round(1 - CPD_WORKLOAD["warm_ratio"], 9), "cold_tokens": CPD_WORKLOAD["doc_tokens"]}
        label = ("CPD blog: B200, 2P1D vs CPD-1D, 20% cold 64K documents, 128-token answers "
                 f"({CPD_WORKLOAD['context']}-token repositories, warmpath repro cpd)")
        same = cfg.context_tokens == CPD_WORKLOAD["context"]
    else:
        # the H100 NIC; repro ppd's middle rate; the ppd-grid's mean first turn (prompt + answer) and follow-up
        point = {"link_gbps": HARDWARE["h100"].nic_bytes_s * 8 / 1e9, "load": PPD_RATES[len(PPD_RATES) // 2],
                 "history": sum(i + o for i, o in PPD_FIRST) / len(PPD_FIRST),
                 "append": sum(i for i, _ in PPD_FOLLOW) / len(PPD_FOLLOW)}
        label = "PPD paper: H100, Llama-3.1-8B, ppd-grid (mean history / append), 400 Gb/s, 12 sessions/s"
        same = False                                    # ppd-grid mixes 18 shapes; a cell has one
    cell = {d: min(vals, key=lambda v, d=d: _distance(d, point[d], v)) for d, vals in cfg.axes().items()}
    return {"label": label, "point": point, "cell": cell, "exact": same and cell == point}


def _distance(dim: str, a, b) -> float:
    if dim == "cold_share":
        return abs(a - b)
    if dim == "split":
        (pa, da), (pb, db) = parse_split(a), parse_split(b)
        return abs(math.log(pa * db / (pb * da)))
    return abs(math.log(a / b))


def cpd_sweep(cfg: MapConfig, cell: dict, policy: str) -> dict:
    """One policy's sweep up the rate grid, stopped at the first rate that misses the SLO
    (no rate above it can count as sustained)."""
    setup = replace(cpd_setup(cpd_topology(cell["split"], policy), cfg.max_in_flight), kv_blocks=cfg.kv_blocks)
    wl = {**CPD_WORKLOAD, "context": cfg.context_tokens, "warm_ratio": 1 - cell["cold_share"],
          "doc_tokens": cell["cold_tokens"], "answer": cell["answer"]}
    make = partial(coding_agent, gen=fast_tokens, **wl)
    runs: dict[float, dict] = {}
    t0 = time.perf_counter()
    for r in cfg.rates:
        run = simulate_rate(setup, make, r * setup.gpus, cfg.duration_s, CPD_SLO, cfg.ramp_s, seed=cfg.seed)
        a = run["classes"]["all"]
        runs[r] = {"slo_met": run["slo_met"], "ttft_p90_s": a["ttft_p90_s"], "success_rate": a["success_rate"],
                   "achieved_per_gpu": run["achieved_rps"] / setup.gpus}
        if not run["slo_met"]:
            break
    return {"sustained": max_rate_from_sweep(runs), "gpus": setup.gpus, "wall_s": time.perf_counter() - t0,
            "runs": {str(r): v for r, v in runs.items()}}


def ppd_sessions(n: int, seed: int, history: int, append: int, answer: int) -> list[Session]:
    """Two-turn sessions: ``history - answer`` new tokens and an answer, then ``append``."""
    rng = random.Random(seed)
    return [Session(f"map-{i}", [Turn(fast_tokens(rng, history - answer), answer, "cold"),
                                 Turn(fast_tokens(rng, append), answer, "warm")]) for i in range(n)]


def ppd_run(cfg: MapConfig, cell: dict, mode: str) -> dict:
    """One PPD mode at the cell's load: turn-2+ TTFT p50 and the local / remote choices."""
    p, d = parse_split(cfg.ppd_split)
    setup = replace(ppd_setup(p, d, mode, cell["link_gbps"]), kv_blocks=cfg.kv_blocks)
    make = partial(ppd_sessions, history=int(cell["history"]), append=int(cell["append"]), answer=cfg.ppd_answer)
    t0 = time.perf_counter()
    run = simulate_rate(setup, make, cell["load"], cfg.duration_s, {}, cfg.ramp_s, seed=cfg.seed)
    t2 = run["classes"]["turn2+"]
    return {"turn2_ttft_p50_s": t2["ttft_p50_s"], "success_rate": run["classes"]["all"]["success_rate"],
            "ppd_local": run["sim"]["ppd_local"], "ppd_remote": run["sim"]["ppd_remote"],
            "wall_s": time.perf_counter() - t0}


def run_map(cfg: MapConfig, jobs: int = 1, cache: Path | None = None, progress=None) -> dict:
    """Every cell × policy (CPD) or mode (PPD), ``jobs`` in parallel; ``map.json``'s content
    (the same for any ``jobs``: each run is seeded by ``cfg.seed`` alone). With ``cache``,
    each finished run is appended to it as a JSON line and runs already there for the same
    settings are reused, so an interrupted (or grown) map resumes where it stopped. ``progress(line)``
    hears about every run as it finishes."""
    cells = grid(cfg)
    arms = ("cpd", "pd", "pd-kv") if cfg.kind == "cpd" else ("x0", "x1", "dynamic")
    fn = cpd_sweep if cfg.kind == "cpd" else ppd_run
    t0 = time.perf_counter()
    tasks = [(i, arm) for i in range(len(cells)) for arm in arms]
    keys = {t: task_key(asdict(cfg), cells[t[0]], t[1]) for t in tasks}
    cached = load_cache(cache)
    results = {t: cached[keys[t]] for t in tasks if keys[t] in cached}
    todo = [t for t in tasks if t not in results]
    sink = open_cache(cache) if cache is not None else None

    def finished(t: tuple, res: dict) -> None:
        results[t] = res
        if sink is not None:
            append(sink, keys[t], res)
        if progress is not None:
            i, arm = t
            what = (f"sustained {res['sustained']}" if cfg.kind == "cpd"
                    else f"turn-2+ TTFT p50 {res['turn2_ttft_p50_s']}")
            progress(f"[{len(results)}/{len(tasks)}] " + " ".join(f"{k}={v}" for k, v in cells[i].items())
                     + f" {arm}: {what} ({res['wall_s']:.0f} s; {time.perf_counter() - t0:.0f} s elapsed)")

    if progress is not None and results:
        progress(f"reusing {len(results)} of {len(tasks)} runs from {cache}")
    try:
        if jobs > 1 and todo:
            with ProcessPoolExecutor(jobs) as pool:
                futs = {pool.submit(fn, cfg, cells[i], arm): (i, arm) for i, arm in todo}
                for f in as_completed(futs):
                    finished(futs[f], f.result())
        else:
            for i, arm in todo:
                finished((i, arm), fn(cfg, cells[i], arm))
    finally:
        if sink is not None:
            sink.close()
    done = [results[t] for t in tasks]
    for (i, arm), res in zip(tasks, done):
        cells[i].setdefault("arms", {})[arm] = res
    for c in cells:
        arm = c["arms"]
        c["gain"] = {name: sustained_gain(arm[a]["sustained"], arm[b]["sustained"], cfg.rates) if cfg.kind == "cpd"
                     else ttft_gain(arm[a]["turn2_ttft_p50_s"], arm[b]["turn2_ttft_p50_s"])
                     for name, (a, b) in COMPARISONS[cfg.kind].items()}
    min_success = CPD_SLO.min_success
    metric = (f"sustained target sessions/s per GPU: the highest of {list(cfg.rates)} meeting TTFT p90 <= "
              f"{CPD_SLO.flat()['ttft_p90']} s with >= {min_success:.0%} success, every lower rate meeting it too"
              if cfg.kind == "cpd" else "turn-2+ TTFT p50 (s), no SLO: gain = baseline TTFT / mode TTFT")
    return {"kind": cfg.kind, "config": asdict(cfg), "metric": metric,
            "slo": {**CPD_SLO.flat(), "min_success": min_success} if cfg.kind == "cpd" else None,
            "dims": [{"name": d, "values": list(v)} for d, v in cfg.axes().items()],
            "comparisons": {k: list(v) for k, v in COMPARISONS[cfg.kind].items()},
            "operating_point": operating_point(cfg), "cells": cells, "wall_s": time.perf_counter() - t0,
            "reused_runs": len(tasks) - len(todo)}


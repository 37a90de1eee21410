"""``warmpath map cpd|ppd``: where CPD and PPD pay off — a grid of simulated workloads and
clusters, drawn as facets of heatmaps (``sim/map_plot.py``) plus ``map.json``.

* ``cpd``: each arm's goodput (``sim/map_cpd.py``: CPD, PD, ``pd-kv`` — the KV-aware single
  pool — and TP4 replicas on the same GPUs) per TPOT target (none / k × the unloaded TPOT),
  which arm wins, and CPD's goodput over each other arm's, across TPOT target × answer length
  (facet rows) × P:D split (facet columns) × cold share (y) × cold document length (x); the
  cluster and workload are ``warmpath repro cpd``'s.
* ``ppd``: turn-2+ TTFT p50 of x=0 over dynamic's and over x=1's across link speed (rows) ×
  load (columns) × history length (y) × append length (x), on ``warmpath repro ppd``'s cluster.

A gain above 1 favours CPD / PPD. The seed's operating point is outlined on its nearest cell.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from warmpath.slo import CPD_TARGET
from warmpath.bench.workload import PPD_FIRST, PPD_FOLLOW, Session, Turn, fast_tokens
from warmpath.sim.map_cache import append, load_cache, open_cache, task_key
from warmpath.sim.map_cpd import ARMS, FIXED_ARMS, GPUS_PER_NODE, cpd_sweep, cpd_topology, parse_split, tpot_label, winner
from warmpath.sim.hardware import HARDWARE
from warmpath.sim.repro import CPD_CONFIGS, CPD_WORKLOAD, PPD_RATES, ppd_setup
from warmpath.sim.run import simulate_rate

__all__ = ["cpd_topology", "parse_split", "GPUS_PER_NODE"]   # the CPD arms live in sim/map_cpd.py
CPD_SLO = CPD_TARGET                # warmpath repro cpd's (slo.py)
DIMS = {"cpd": ("answer", "split", "cold_share", "cold_tokens"),       # facet row, facet column, y, x
        "ppd": ("link_gbps", "load", "history", "append")}
COMPARISONS = {"cpd": {"cpd_vs_pd": ("cpd", "pd"), "cpd_vs_pd-kv": ("cpd", "pd-kv"),
                       "cpd_vs_replica": ("cpd", "replica"), "goodput_vs_cpd": ("goodput", "cpd"),
                       "goodput_vs_pd": ("goodput", "pd"), "goodput_vs_replica": ("goodput", "replica"),
                       "goodput-replica_vs_pd": ("goodput-replica", "pd"),
                       "goodput-replica_vs_replica": ("goodput-replica", "replica"),
                       "goodput-replica-e_vs_replica": ("goodput-replica-e", "replica")},
               "ppd": {"dynamic_vs_x0": ("dynamic", "x0"), "x1_vs_x0": ("x1", "x0")}}
PPD_ARMS = ("x0", "x1", "dynamic")


@dataclass(frozen=True)
class MapConfig:
    """One map. CPD: ``rates`` are target sessions/s per GPU (the repro's QPS/GPU), ascending;
    splits ``"<p>P<d>D"`` count 4-GPU nodes (CPD: ``p // 2`` pre-prefill + the rest prefill);
    ``context_tokens`` is the warm repositories' shared context. PPD: a session is a turn of
    ``history - answer`` new tokens and its ``answer``, then an append and another ``answer``;
    ``loads`` are sessions/s on the ``ppd_split`` cluster (TP1 workers). CPD only: ``arms``
    (of ``cpd``, ``pd``, ``pd-kv``, ``replica`` — the default — ``goodput``,
    ``goodput-replica`` and ``goodput-replica-e``) and ``tpot_targets`` (``none`` or factors of
    the unloaded TPOT; ``sim/map_cpd.py``)."""

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
    arms: tuple = FIXED_ARMS
    tpot_targets: tuple = ("none", "2", "1.3")

    def __post_init__(self) -> None:
        if self.kind not in DIMS:
            raise ValueError(f"map: kind must be one of {sorted(DIMS)}, got {self.kind!r}")
        object.__setattr__(self, "tpot_targets", tuple(tpot_label(x) for x in self.tpot_targets))
        if not self.arms or set(self.arms) - set(ARMS) or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"map: arms must be distinct, of {', '.join(ARMS)}; got {list(self.arms)}")
        for name in ("cold_shares", "cold_tokens", "answers", "splits", "rates", "histories", "appends",
                     "links_gbps", "loads", "tpot_targets"):
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


def grid(cfg: MapConfig) -> list[dict]:
    """Every cell, row-major over the facet rows, facet columns, y, then x."""
    axes = cfg.axes()
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]


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


def _key(cfg: MapConfig, cell: dict, arm: str, label: str | None) -> str:
    """A run's cache key: CPD's cell carries its TPOT target (so runs judged otherwise, or
    before the targets existed, are never reused for it); PPD's as before."""
    return task_key(asdict(cfg), cell if label is None else {**cell, "tpot_target": label}, arm)


def run_task(cfg: MapConfig, cell: dict, arm: str, labels: tuple) -> dict:
    """One (cell, arm): CPD's sweep judged under every TPOT target of ``labels`` (label →
    result), PPD's run (``{None: result}``)."""
    if cfg.kind == "cpd":
        return cpd_sweep(cfg, cell, arm, labels)
    return {None: ppd_run(cfg, cell, arm)}


def run_map(cfg: MapConfig, jobs: int = 1, cache: Path | None = None, progress=None) -> dict:
    """Every cell × arm (CPD: × TPOT target) or mode (PPD), ``jobs`` in parallel; ``map.json``'s
    content (the same for any ``jobs``: each run is seeded by ``cfg.seed`` alone). With
    ``cache``, each finished run is appended to it as a JSON line and runs already there for
    the same settings are reused, so an interrupted (or grown) map resumes where it stopped:
    a (cell, arm) reruns only for the TPOT targets it lacks. ``progress(line)`` hears about
    every (cell, arm) as it finishes."""
    cells = grid(cfg)
    arms = cfg.arms if cfg.kind == "cpd" else PPD_ARMS
    labels = cfg.tpot_targets if cfg.kind == "cpd" else (None,)
    t0 = time.perf_counter()
    keys = {(i, arm, lab): _key(cfg, cells[i], arm, lab)
            for i in range(len(cells)) for arm in arms for lab in labels}
    cached = load_cache(cache)
    results = {t: cached[k] for t, k in keys.items() if k in cached}
    todo: dict[tuple, tuple] = {}
    for i, arm, lab in keys:
        if (i, arm, lab) not in results:
            todo[(i, arm)] = (*todo.get((i, arm), ()), lab)
    sink = open_cache(cache) if cache is not None and todo else None
    total, done = len(cells) * len(arms), [len(cells) * len(arms) - len(todo)]

    def finished(t: tuple, res: dict) -> None:
        done[0] += 1
        for lab, r in res.items():
            results[(*t, lab)] = r
            if sink is not None:
                append(sink, keys[(*t, lab)], r)
        if progress is not None:
            what = (", ".join(f"TPOT {lab}: goodput {r['goodput']}" for lab, r in res.items()) if cfg.kind == "cpd"
                    else f"turn-2+ TTFT p50 {res[None]['turn2_ttft_p50_s']}")
            wall = next(iter(res.values()))["wall_s"]
            progress(f"[{done[0]}/{total}] " + " ".join(f"{k}={v}" for k, v in cells[t[0]].items())
                     + f" {t[1]}: {what} ({wall:.0f} s; {time.perf_counter() - t0:.0f} s elapsed)")

    if progress is not None and results:
        progress(f"reusing {len(results)} of {len(keys)} runs from {cache}")
    try:
        if jobs > 1 and len(todo) > 1:
            with ProcessPoolExecutor(jobs) as pool:
                futs = {pool.submit(run_task, cfg, cells[i], arm, labs): (i, arm) for (i, arm), labs in todo.items()}
                for f in as_completed(futs):
                    finished(futs[f], f.result())
        else:
            for (i, arm), labs in todo.items():
                finished((i, arm), run_task(cfg, cells[i], arm, labs))
    finally:
        if sink is not None:
            sink.close()
    reused = len(keys) - sum(len(labs) for labs in todo.values())
    return assemble(cfg, cells, arms, labels, results, time.perf_counter() - t0, reused)


def assemble(cfg: MapConfig, cells: list[dict], arms: tuple, labels: tuple, results: dict, wall_s: float,
             reused: int) -> dict:
    """``map.json``: per cell its arms' results, the gains and (CPD) each TPOT target's winner."""
    comparisons = {k: v for k, v in COMPARISONS[cfg.kind].items() if set(v) <= set(arms)}
    for i, c in enumerate(cells):
        if cfg.kind == "ppd":
            c["arms"] = {arm: results[(i, arm, None)] for arm in arms}
            c["gain"] = {name: ttft_gain(c["arms"][a]["turn2_ttft_p50_s"], c["arms"][b]["turn2_ttft_p50_s"])
                         for name, (a, b) in comparisons.items()}
            continue
        c["arms"] = {arm: {lab: results[(i, arm, lab)] for lab in labels} for arm in arms}
        c["unloaded_tpot_s"] = c["arms"][arms[0]][labels[0]]["unloaded_tpot_s"]
        good = {lab: {arm: c["arms"][arm][lab]["goodput"] for arm in arms} for lab in labels}
        c["gain"] = {name: {lab: sustained_gain(good[lab][a], good[lab][b], cfg.rates) for lab in labels}
                     for name, (a, b) in comparisons.items()}
        c["winner"] = {lab: winner(good[lab], cfg.rates) for lab in labels}
    if cfg.kind == "cpd":
        metric = (f"goodput, target sessions/s per GPU: the highest of {list(cfg.rates)} at which >= "
                  f"{CPD_SLO.attain:.0%} of requests attain TTFT <= {CPD_SLO.flat()['ttft_p90']} s (and, under TPOT "
                  "target k, TPOT <= k x the cell's unloaded TPOT p90), every lower rate attaining too")
        slo = {**CPD_SLO.flat(), "min_success": CPD_SLO.min_success, "attain": CPD_SLO.attain,
               "tpot_targets": list(labels), "unloaded_tpot": "roofline batch-1 decode, one B200 (TP1), p90"}
    else:
        metric, slo = "turn-2+ TTFT p50 (s), no SLO: gain = baseline TTFT / mode TTFT", None
    return {"kind": cfg.kind, "config": asdict(cfg), "metric": metric, "slo": slo,
            "dims": [{"name": d, "values": list(v)} for d, v in cfg.axes().items()],
            "arms": list(arms), "tpot_targets": list(labels) if cfg.kind == "cpd" else None,
            "comparisons": {k: list(v) for k, v in comparisons.items()},
            "operating_point": operating_point(cfg), "cells": cells, "wall_s": wall_s, "reused_runs": reused}

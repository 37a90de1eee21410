"""``warmpath map cpd|ppd``: the flags of :class:`~warmpath.sim.map.MapConfig`, the run,
``map.json`` and the heatmaps (``sim/map_plot.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from warmpath.sim.map import DIMS, MapConfig, quick, run_map


def add_parser(sub) -> None:
    m = sub.add_parser("map", help="heatmaps of where CPD / PPD pay off (simulated grid)")
    m.add_argument("kind", choices=tuple(DIMS))
    m.add_argument("--quick", action="store_true", help="a tiny grid (smoke test); other grid flags still apply")
    d = MapConfig()
    for flag, name in (("--cold-shares", "cold_shares"), ("--cold-tokens", "cold_tokens"), ("--answers", "answers"),
                       ("--splits", "splits"), ("--rates", "rates"), ("--histories", "histories"),
                       ("--appends", "appends"), ("--links", "links_gbps"), ("--loads", "loads"),
                       ("--arms", "arms"), ("--tpot-targets", "tpot_targets")):
        m.add_argument(flag, dest=name, default=None,
                       help=f"comma-separated (default {','.join(map(str, getattr(d, name)))})")
    for flag, name, typ in (("--context-tokens", "context_tokens", int), ("--max-in-flight", "max_in_flight", int),
                            ("--ppd-split", "ppd_split", str), ("--ppd-answer", "ppd_answer", int),
                            ("--duration", "duration_s", float), ("--ramp", "ramp_s", float)):
        m.add_argument(flag, dest=name, type=typ, default=None, help=f"default {getattr(d, name)}")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--jobs", type=int, default=2, help="simulations in parallel")
    m.add_argument("--out", type=Path, default=None, help="default map_<kind>")
    m.add_argument("--fresh", action="store_true",
                   help="ignore <out>/cells.jsonl (finished runs, reused by default so a stopped map resumes)")
    m.set_defaults(fn=main)


def config_from_args(a: argparse.Namespace) -> MapConfig:
    """``--quick`` or the defaults, with every grid flag given applied over it."""
    base = quick(a.kind, a.seed) if a.quick else MapConfig(a.kind, seed=a.seed)
    over = {}
    for name, val in vars(a).items():
        if val is None or not hasattr(base, name) or name in ("kind", "seed"):
            continue
        if isinstance(getattr(base, name), tuple):
            cast = str if name in ("splits", "arms", "tpot_targets") else int if name in ("cold_tokens", "answers", "histories",
                                                                 "appends") else float
            try:
                val = tuple(cast(x) for x in val.split(","))
            except ValueError as e:
                raise ValueError(f"--{name.replace('_', '-')}: {e}") from e
        over[name] = val
    return MapConfig(**{**asdict(base), **over})


def main(a: argparse.Namespace) -> int:
    from warmpath.sim.map_plot import cell_text, plot_map, winner_text

    if a.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {a.jobs}")
    cfg = config_from_args(a)
    out = a.out or Path(f"map_{cfg.kind}")
    cache = out / "cells.jsonl"
    if a.fresh and cache.exists():
        cache.unlink()
    result = run_map(cfg, a.jobs, cache=cache, progress=lambda line: print(line, file=sys.stderr, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    (out / "map.json").write_text(json.dumps(result, indent=1))
    figures = plot_map(result, out)
    for c in result["cells"]:
        where = " ".join(f"{k}={c[k]}" for k in cfg.axes())
        if cfg.kind == "ppd":
            print(where, "|", ", ".join(f"{k} {cell_text(g)}" for k, g in c["gain"].items()), flush=True)
            continue
        for lab in cfg.tpot_targets:
            print(f"{where} tpot={lab} | winner " + " ".join(winner_text(c["winner"][lab], list(cfg.rates))) + " | "
                  + ", ".join(f"{k} {cell_text(g[lab])}" for k, g in c["gain"].items()), flush=True)
    reused = f" ({result['reused_runs']} runs reused from {cache})" if result["reused_runs"] else ""
    print(f"{len(result['cells'])} cells in {result['wall_s']:.0f} s{reused}; wrote {out / 'map.json'}, "
          + ", ".join(str(f) for f in figures))
    return 0

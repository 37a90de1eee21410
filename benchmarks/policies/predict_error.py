"""How far the ``goodput`` policy's predictions were from what its requests measured (issue 29's
Measure item: median |error| of predicted TPOT <= 20% and TTFT <= 15% at low load, reported
under load), per path (``local``: prefilled on the decode worker; ``remote``: warm or cold
tier) and rate, from ``requests.jsonl`` (``path``, ``predicted_ttft_s``, ``predicted_tpot_s``).

Why a TPOT prediction missed: each request's timeline is rebuilt from the workload's arrivals
(the ranking's ``agent`` sessions and seeds; a session's next turn is sent when its answer
ends), and the seconds of *local prefills on its decode worker* that overlap its decode (from
its first token to its end) are summed — ``stretch_known``: prefills that had arrived before it
(the router could see them), ``stretch_later``: ones arriving after it (it could not); a prompt
counts from when the one ahead of it there was done (first come, first served). Their sum
per token, taken off the measured TPOT, leaves the decode steps alone (``decode_only``): set
beside the prediction, it shows what a step-cost error (the served decode factor, the online
correction) accounts for and what the chunks do.

    python -m benchmarks.policies.predict_error [DIR ...] [--duration 60] [--out FILE]

DIRs default to ``benchmarks/results/ranking/*/goodput-1p1d_s*`` (``real``; ``sim``: the
simulator before issue 29's predictor fixes; ``sim_new``: after, ``ranking_requests --write``); a
DIR ending in ``_s<seed>`` is that seed's sweep, its folder's name the rows' ``source``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from benchmarks.common.results import read_json, read_jsonl, stored

RESULTS = Path("benchmarks/results/ranking")
LOW_RATE = 0.05


def load(d: Path) -> list[dict]:
    """``d/requests.jsonl``'s answered rows that carry a path, with ``seed`` and ``source``. A
    prediction is made when the router sends the request; the time it waited there before (its
    ``route`` stage: admission, the policy's hold) is known then, so it is added to the predicted
    TTFT, which is set beside the TTFT the client measured from its send."""
    m = re.search(r"_s(\d+)$", d.name)
    rows = read_jsonl(d / "requests.jsonl")
    for r in rows:
        r["seed"], r["source"] = int(m.group(1)) if m else None, d.parent.name
        waited = (r.get("server_timing") or {}).get("route", 0.0)
        if r.get("predicted_ttft_s") is not None and waited:
            r["predicted_ttft_s"] += waited
    # the goodput policy's rows: those with a predicted TPOT (older files: a "path" written only for it)
    return [r for r in rows if r["ok"] and r.get("predicted_tpot_s") is not None]


def timeline(rows: list[dict], duration_s: float) -> list[dict]:
    """``arrival_s`` / ``first_s`` / ``end_s`` of each row (seconds into its rate point), from the
    ranking workload's arrivals of its seed and rate (``ranking_requests.sends``)."""
    from benchmarks.policies.ranking_requests import sends, session_starts

    by_point: dict = {}
    for r in rows:
        by_point.setdefault((r["source"], r["seed"], r["rate"]), []).append(r)
    for (_, seed, rate), rs in by_point.items():
        if seed is None:
            continue
        for t, _, r in sends(rs, session_starts(seed, rate, duration_s)):
            r.update(arrival_s=t, first_s=t + r["ttft_s"], end_s=t + r["e2e_s"])
    return rows


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def computing(rows: list[dict]) -> dict[int, tuple[float, float]]:
    """When each local row's prompt was being computed on its decode worker: from its arrival
    or the end of the one before it there (first come, first served), to its first token."""
    out: dict[int, tuple[float, float]] = {}
    by: dict = {}
    for r in rows:
        if r["path"] == "local" and "arrival_s" in r:
            by.setdefault((r["source"], r["seed"], r["rate"], r["decode"]), []).append(r)
    for rs in by.values():
        busy = float("-inf")
        for r in sorted(rs, key=lambda x: x["arrival_s"]):
            out[id(r)] = (min(max(r["arrival_s"], busy), r["first_s"]), r["first_s"])
            busy = max(busy, r["first_s"])
    return out


def stretches(rows: list[dict]) -> list[dict]:
    """Each timed row's ``stretch_known_s`` / ``stretch_later_s``: the seconds of other rows'
    local prefills on its decode worker (while computed: :func:`computing`) within its decode,
    split by whether they arrived before it."""
    timed = [r for r in rows if "arrival_s" in r]
    comp = computing(timed)
    for r in timed:
        known = later = 0.0
        for p in timed:
            if p is r or id(p) not in comp or p["decode"] != r["decode"] or \
                    (p["seed"], p["rate"], p["source"]) != (r["seed"], r["rate"], r["source"]):
                continue
            o = overlap(r["first_s"], r["end_s"], *comp[id(p)])
            if p["arrival_s"] <= r["arrival_s"]:
                known += o
            else:
                later += o
        r["stretch_known_s"], r["stretch_later_s"] = known, later
    return rows


def rel(pred: float | None, meas: float | None) -> float | None:
    """``pred / meas − 1`` (signed relative error), ``None`` when either is missing."""
    return None if not pred or not meas else pred / meas - 1


def med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 4) if xs else None


def mean(xs: list) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


def summarize(rows: list[dict], ttft_key: str = "predicted_ttft_s", tpot_key: str = "predicted_tpot_s",
              parts_key: str | None = None) -> dict:
    """Median |error| and signed error of TTFT and TPOT, the mean stretch per token (known,
    later) and the decode-only TPOT error, over ``rows``: the measured TPOT less the stretch per
    token against the predicted one less its chunks' share (``parts_key``: a row's
    ``PathPrediction.tpot_parts``; without it, none: the rows' records do not carry it)."""
    e_ttft = [rel(r.get(ttft_key), r["ttft_s"]) for r in rows]
    e_tpot = [rel(r.get(tpot_key), r["tpot_s"]) for r in rows]
    per_tok = [(r.get("stretch_known_s", 0.0) + r.get("stretch_later_s", 0.0)) / max(1, r["output_tokens"] - 1)
               for r in rows]
    pred_dec = [r.get(tpot_key) and r[tpot_key] - (r[parts_key][0] if parts_key and r.get(parts_key) else 0.0)
                for r in rows]
    dec_only = [rel(p, r["tpot_s"] - s) if r["tpot_s"] - s > 0 else None for r, s, p in zip(rows, per_tok, pred_dec)]
    return {"n": len(rows), "ttft_abs": med([abs(e) for e in e_ttft if e is not None]), "ttft_signed": med(e_ttft),
            "tpot_abs": med([abs(e) for e in e_tpot if e is not None]), "tpot_signed": med(e_tpot),
            "stretched": sum(1 for s in per_tok if s > 0),
            "stretch_known_per_tok": mean([r.get("stretch_known_s", 0) / max(1, r["output_tokens"] - 1) for r in rows]),
            "stretch_later_per_tok": mean([r.get("stretch_later_s", 0) / max(1, r["output_tokens"] - 1) for r in rows]),
            "tpot_decode_only_abs": med([abs(e) for e in dec_only if e is not None]),
            "tpot_decode_only_signed": med(dec_only)}


def group(r: dict) -> str:
    return "local" if r["path"] == "local" else "remote"


def report(rows: list[dict], **keys) -> dict:
    """Per source (real / sim), path and rate (and every rate together): :func:`summarize`."""
    out: dict = {}
    for src in sorted({r["source"] for r in rows}):
        mine = [r for r in rows if r["source"] == src]
        for g in ("local", "remote", "all"):
            sel = [r for r in mine if g == "all" or group(r) == g]
            for rate in sorted({r["rate"] for r in sel}) + ["all"]:
                part = [r for r in sel if rate == "all" or r["rate"] == rate]
                if part:
                    out.setdefault(src, {}).setdefault(g, {})[str(rate)] = summarize(part, **keys)
    return out


def show(out: dict, title: str) -> None:
    f = lambda x: "-" if x is None else f"{100 * x:+.0f}%" if isinstance(x, float) else str(x)
    print(f"## {title}\nsource path rate: n | TTFT |err| (signed) | TPOT |err| (signed) | stretched, "
          f"mean stretch/token known later (s) | decode-only TPOT |err| (signed)")
    for src, gs in out.items():
        for g, rates in gs.items():
            for rate, s in rates.items():
                print(f"{src:4s} {g:6s} {rate:5s}: {s['n']:3d} | {f(s['ttft_abs'])} ({f(s['ttft_signed'])}) | "
                      f"{f(s['tpot_abs'])} ({f(s['tpot_signed'])}) | {s['stretched']:3d}, "
                      f"{s['stretch_known_per_tok'] or 0:.3f} {s['stretch_later_per_tok'] or 0:.3f} | "
                      f"{f(s['tpot_decode_only_abs'])} ({f(s['tpot_decode_only_signed'])})")


def measure_item(out: dict) -> dict:
    """The issue's Prediction goal at low load (the lowest rate), every path together."""
    got = {}
    for src, gs in out.items():
        s = gs["all"].get(str(LOW_RATE))
        if s:
            got[src] = {"ttft_abs": s["ttft_abs"], "tpot_abs": s["tpot_abs"],
                        "met": (s["ttft_abs"] or 0) <= 0.15 and (s["tpot_abs"] or 0) <= 0.20}
    return got


def run_duration(dirs: list[Path], default: float = 60.0) -> float:
    """The windows' length of the ranking run the dirs belong to (``<run>/real/<arm>_s<seed>``:
    ``<run>/ranking.json``'s ``duration_s``), else ``default``."""
    for d in dirs:
        f = d.parent.parent / "ranking.json"
        if stored(f):
            return float(read_json(f).get("duration_s", default))
    return default


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", type=Path)
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of each rate point (default: the run's ranking.json `duration_s`, else 60)")
    p.add_argument("--out", type=Path, default=RESULTS / "predict_error.json")
    a = p.parse_args(argv)
    dirs = a.dirs or sorted(RESULTS.glob("*/goodput-1p1d_s*"))
    if missing := [str(d) for d in dirs if not stored(d / "requests.jsonl")]:
        p.error(f"no requests.jsonl in {missing}")
    duration = a.duration or run_duration(dirs)
    try:
        rows = stretches(timeline([r for d in dirs for r in load(d)], duration))
    except KeyError as e:
        p.error(f"session {e} is not among the arrivals of {duration:g}-s windows: pass the ranking's --duration")
    out = report(rows)
    show(out, "recorded predictions")
    result = {"dirs": [str(d) for d in dirs], "recorded": out, "low_load": measure_item(out)}
    print(json.dumps(result["low_load"]))
    a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

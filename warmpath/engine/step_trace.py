"""Write, read and analyse engine step traces (``warmpath worker --step-trace``; no torch).

A trace holds one JSON line per engine step: ``t0``/``t1`` (monotonic seconds, comparable
across the processes of one machine), ``exec_s`` (compute), ``tiers_s`` (KV-tier work at the
step's ends) and ``items`` (``[new_tokens, context]`` per sequence). Given the traces of all
the workers of one run, a step's *overlap* is how many other workers were stepping during
it, on average over its length: that separates steps that ran alone (what a step model
should be fitted on) from steps that shared the machine.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from pathlib import Path

from warmpath.engine.step_model import StepProfile

ALONE = 0.05   # a step is "alone" when others stepped during less than this share of it


class StepTraceWriter:
    """Appends one line per engine step to ``path`` (line-buffered: readable while it runs)."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)

    def write(self, seconds: float, exec_s: float, tiers_s: float, items: list[tuple[int, int]]) -> None:
        """A step that just ended after ``seconds``; ``items``: (new tokens, context) per sequence."""
        now = time.monotonic()    # monotonic clock: comparable across processes on one machine
        self._f.write(json.dumps({"t0": now - seconds, "t1": now, "exec_s": exec_s,
                                  "tiers_s": tiers_s, "items": items}) + "\n")

    def close(self) -> None:
        self._f.close()


def read_step_trace(path) -> dict[str, list[dict]]:
    """A ``--step-trace`` file, or a folder of them → each worker's steps (by file name). A file
    may be gzipped (``decode-0.jsonl.gz``: how ``benchmarks/results/`` keeps the large ones); in a
    folder holding both, the plain one is read."""
    path = Path(path)
    files = [*sorted(path.glob("*.jsonl.gz")), *sorted(path.glob("*.jsonl"))] if path.is_dir() else [path]
    out = {}
    for f in files:
        gz = f.suffix == ".gz"
        text = gzip.decompress(f.read_bytes()).decode() if gz else f.read_text()
        out[Path(f.name[:-3]).stem if gz else f.stem] = [json.loads(x) for x in text.splitlines() if x]
    return out


def overlap(step: dict, spans: list[tuple[float, float]]) -> float:
    """Seconds of ``spans`` inside ``step``, over its length."""
    return sum(max(0.0, min(step["t1"], b) - max(step["t0"], a)) for a, b in spans) / max(step["t1"] - step["t0"], 1e-9)


def overlaps(steps: dict[str, list[dict]]) -> dict[str, list[float]]:
    """For each worker's steps: seconds of other workers' steps inside it over its length."""
    out = {}
    for w, mine in steps.items():
        spans = [(o["t0"], o["t1"]) for v, ss in steps.items() if v != w for o in ss]
        out[w] = [overlap(s, spans) for s in mine]
    return out


def profile_from_trace(steps: dict[str, list[dict]], ov: dict[str, list[float]] | None = None) -> StepProfile:
    """Rows from the workers' step traces of one run: one-sequence prefill steps, pure decode
    steps and mixed steps (decodes plus prefill chunks: their token sum at its token-weighted
    context) that ran alone, timed without their KV-tier work (the simulator charges that
    separately); steps of several prefills and no decode are left out. ``ov``: the steps'
    :func:`overlaps`, where the caller has them already (the trace's other readings share them)."""
    prof = StepProfile()
    ov = ov if ov is not None else overlaps(steps)
    for w, mine in steps.items():
        for s, k in zip(mine, ov[w]):
            items = s["items"]
            t = s["t1"] - s["t0"] - s.get("tiers_s", 0.0)
            if not items or t <= 0 or k >= ALONE:
                continue
            dec = [c for n, c in items if n == 1]
            pre = [(n, c) for n, c in items if n > 1]
            if not pre:
                prof.decode.append((len(dec), sum(dec) // len(dec), t))
            elif dec:
                n = sum(x for x, _ in pre)
                prof.mixed.append((len(dec), sum(dec) // len(dec), n, sum(x * c for x, c in pre) // n, t))
            elif len(items) == 1:
                prof.prefill.append((items[0][0], items[0][1], t))
    return prof


def _shape(items: list) -> tuple:
    """Steps of one shape take the same time but for noise: decodes by batch and context (to
    256 tokens), prefills by their token counts and contexts (to 64 tokens)."""
    if all(n == 1 for n, _ in items):
        return ("decode", len(items), sum(c for _, c in items) // len(items) // 256)
    return ("prefill", tuple(n for n, _ in items), tuple(c // 64 for _, c in items))


def trace_variation(steps: dict[str, list[dict]], min_steps: int = 2, ov: dict[str, list[float]] | None = None) -> dict:
    """How real steps vary, for the simulator's CPU profile, comparing steps of one worker and
    one shape (so that no model error enters).

    ``step_cv``: the spread of compute times of steps that ran alone around their shape's
    mean (shapes with 3+ such steps). ``contention``: how much slower a step computes while
    about one other worker steps beside it (two processes on two cores: no core is shared,
    so this is what the shared caches and memory cost) than the same shape alone — the median
    over shapes with ``min_steps`` of each. ``None`` where the trace has no such steps. ``ov``: as
    :func:`profile_from_trace`'s."""
    ov = ov if ov is not None else overlaps(steps)
    groups: dict[tuple, dict[str, list[float]]] = {}
    for w, mine in steps.items():
        for s, k in zip(mine, ov[w]):
            if not s["items"]:
                continue
            g = groups.setdefault((w, _shape(s["items"])), {"alone": [], "one": []})
            if k < ALONE:
                g["alone"].append(s["exec_s"])
            elif round(k) == 1:
                g["one"].append(s["exec_s"])
    dev = [x / statistics.fmean(g["alone"]) for g in groups.values() if len(g["alone"]) >= 3 for x in g["alone"]]
    ratios = [statistics.median(g["one"]) / statistics.median(g["alone"]) - 1.0 for g in groups.values()
              if len(g["alone"]) >= min_steps and len(g["one"]) >= min_steps]
    return {"step_cv": statistics.pstdev(dev) if len(dev) >= 3 else None,
            "contention": statistics.median(ratios) if ratios else None,
            "steps_alone": sum(len(g["alone"]) for g in groups.values()), "shapes_compared": len(ratios)}


def contention_over_model(steps: dict[str, list[dict]], model, min_steps: int = 20, band: float = 0.1,
                          ov: dict[str, list[float]] | None = None) -> dict:
    """How much slower steps compute while one other worker steps beside them, every step's
    compute time taken over the step model's (``model.step_s``), so steps of every shape count
    (:func:`trace_variation` compares only shapes that happened to run both ways, a handful in a
    short trace). Per worker: median over the model of the steps with another worker stepping
    through ``1 ± band`` of them, over the same of the steps that ran alone, less 1, where each
    has ``min_steps``; ``contention``: their mean weighted by the steps beside (``None`` where
    no worker has enough of both). ``ov``: as :func:`profile_from_trace`'s."""
    ov = ov if ov is not None else overlaps(steps)
    per: dict[str, dict] = {}
    for w, mine in steps.items():
        alone, one = [], []
        for s, k in zip(mine, ov[w]):
            est = model.step_s([tuple(x) for x in s["items"]]) if s["items"] else 0.0
            if est <= 0 or s["exec_s"] <= 0:
                continue
            if k < ALONE:
                alone.append(s["exec_s"] / est)
            elif abs(k - 1.0) <= band:
                one.append(s["exec_s"] / est)
        if len(alone) >= min_steps and len(one) >= min_steps:
            per[w] = {"alone": len(alone), "beside": len(one),
                      "contention": statistics.median(one) / statistics.median(alone) - 1.0}
    n = sum(v["beside"] for v in per.values())
    return {"contention": sum(v["contention"] * v["beside"] for v in per.values()) / n if n else None,
            "workers": per}

"""Mixed-step fit on held-out served steps (issue 28: median per-step error ≤ 10%).

A mixed step is a decode batch with a prefill chunk in the same engine step. Each fold fits a
:class:`~warmpath.engine.step_model.StepModel` as ``warmpath calibrate --from-trace`` does —
an isolated step profile (a calibration's timed prefill, decode and mixed rows) plus the
training runs' step traces (steps that ran alone) — and predicts every mixed step that ran
alone in the held-out runs' traces (a different served run), with the old formula
(decode + prefill − a0, same prefill and decode lines) and with the fitted mixed form.
Offline, a second or two::

    python -m benchmarks.sim_accuracy.mixed_fit [--out benchmarks/results/sim_accuracy/mixed_fit.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from warmpath.engine.step_model import StepModel, StepProfile
from warmpath.engine.step_trace import profile_from_trace, read_step_trace

RES = Path("benchmarks/results")
ISOLATED = RES / "cluster/calibration_ctx1600.json"   # `calibrate --contexts 128,512,1600`, no traces
T = "request_overhead_trace"
# two folds over the five traced runs of docs/benchmarks/sim_accuracy.md: fresh clusters at
# 0.1 / 0.15 / 0.25 sessions/s against one cluster serving the three rates in a row
FOLDS = {"rates_seq held out": ([T, f"{T}_rate0.1", f"{T}_rate0.15", f"{T}_rate0.25"], [f"{T}_rates_seq"]),
         "fresh rates held out": ([T, f"{T}_rates_seq"], [f"{T}_rate0.1", f"{T}_rate0.15", f"{T}_rate0.25"])}


def isolated_profile(path: Path) -> StepProfile:
    """A calibration's timed rows (its ``profile``)."""
    p = json.loads(path.read_text())["profile"]
    return StepProfile(list(p["prefill"]), list(p["decode"]), list(p["mixed"]))


def fold_model(isolated: StepProfile, train: list[str]) -> StepModel:
    """The step model ``calibrate`` would fit from ``isolated`` plus the training traces."""
    prof = isolated
    for d in train:
        prof = prof.extend(profile_from_trace(read_step_trace(RES / d)))
    return prof.fit()


def errors(model: StepModel, rows: list[tuple]) -> dict:
    """Per-step relative errors (predicted / measured − 1) of the old form and the fit."""
    old = StepModel(model.prefill_coef, model.decode_coef, model.decode_scale)
    return {"old": [old.mixed_s(b, cd, t, cp) / s - 1 for b, cd, t, cp, s in rows],
            "fit": [model.mixed_s(b, cd, t, cp) / s - 1 for b, cd, t, cp, s in rows]}


def summary(errs: list[float]) -> dict:
    """Median and p90 of |error|, and the signed median."""
    a = sorted(abs(e) for e in errs)
    if not a:
        return {"n": 0}
    return {"n": len(a), "median_abs": statistics.median(a), "p90_abs": a[min(len(a) - 1, int(0.9 * len(a)))],
            "median_signed": statistics.median(errs)}


def run(isolated_path: Path = ISOLATED) -> dict:
    """Every fold, then all held-out steps pooled."""
    iso = isolated_profile(isolated_path)
    out: dict = {"isolated": str(isolated_path), "folds": {}}
    pooled: dict[str, list[float]] = {"old": [], "fit": []}
    for name, (train, test) in FOLDS.items():
        model = fold_model(iso, train)
        rows = [r for d in test for r in profile_from_trace(read_step_trace(RES / d)).mixed]
        errs = errors(model, rows)
        for k in pooled:
            pooled[k] += errs[k]
        out["folds"][name] = {"train": train, "test": test, "mixed_form": model.mixed_form,
                              "mixed_coef": list(model.mixed_coef), "train_mixed_rows": model.mixed_rows,
                              "test_rows": [list(r) for r in rows],
                              "old": summary(errs["old"]), "fit": summary(errs["fit"]),
                              "errors": {k: [round(e, 4) for e in v] for k, v in errs.items()}}
    out["pooled"] = {k: summary(v) for k, v in pooled.items()}
    return out


def main(argv: list[str] | None = None) -> None:
    """Run the folds, print a table, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--isolated", type=Path, default=ISOLATED, help="calibration whose timed rows each fold fits on")
    p.add_argument("--out", type=Path, default=RES / "sim_accuracy/mixed_fit.json")
    a = p.parse_args(argv)
    res = run(a.isolated)
    rows = [*((n, f) for n, f in res["folds"].items()), ("pooled", res["pooled"])]
    print(f"{'held out':<22} {'steps':>5}  {'old median':>10} {'old p90':>8}  {'fit median':>10} {'fit p90':>8}")
    for name, f in rows:
        o, n = f["old"], f["fit"]
        if not o["n"]:
            print(f"{name:<22} {0:>5}")
            continue
        print(f"{name:<22} {o['n']:>5}  {o['median_abs']:>10.1%} {o['p90_abs']:>8.1%}  "
              f"{n['median_abs']:>10.1%} {n['p90_abs']:>8.1%}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

"""What ``warmpath plan`` writes: ``plan.json`` (everything), ``plan.csv`` and ``plan.md`` (one
row per candidate, ranked), ``plan.png`` (sustained load per GPU of every candidate) and the
recommended and runner-up topologies as ``--topology`` files (``recommended.json``, ...)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

COLUMNS = ("rank", "candidate", "kind", "gpus", "ppd", "stage", "sustained_load", "sustained_rate", "per_gpu",
           "ttft_p90_s", "tpot_s", "headroom", "points", "wall_s", "cpu_s")
COLORS = {"replica": "tab:gray", "pd": "tab:blue", "cpd": "tab:orange"}


def table(result: dict) -> list[dict]:
    """The ranked rows, flat (numbers rounded for reading)."""
    out = []
    for i, r in enumerate(result["rows"], 1):
        row = {k: r.get(k) for k in COLUMNS}
        row.update(rank=i, points=len(r["points"]))
        for k in ("sustained_load", "sustained_rate", "per_gpu", "ttft_p90_s", "tpot_s", "headroom", "wall_s", "cpu_s"):
            if row[k] is not None:
                row[k] = float(f"{row[k]:.4g}")
        out.append(row)
    return out


def _markdown(result: dict, rows: list[dict]) -> str:
    head = (f"# warmpath plan\n\nrecommended: **{result['recommended']}**; runner-up: {result['runner_up']}\n\n"
            f"load: {result.get('load', '')}; per GPU in {result.get('unit', '')}; stage `full`: the whole "
            f"load, `screen`: the screening sample only\n\n")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join("-" if r[k] is None else str(r[k]) for k in COLUMNS) + " |" for r in rows]
    return head + "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path:
    """Horizontal bars: sustained load per GPU by candidate, ranked; hatched: screen only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.22 * len(rows)))
    ys = range(len(rows))[::-1]
    for y, r in zip(ys, rows):
        ax.barh(y, r["per_gpu"] or 0.0, color=COLORS.get(r["kind"], "tab:green"),
                hatch="//" if r["stage"] == "screen" else None, edgecolor="black", linewidth=0.3)
        if r.get("screen", {}).get("per_gpu") is not None:   # a finalist: what its screen said
            ax.plot(r["screen"]["per_gpu"], y, "k|", markersize=12)
    ax.set_yticks(list(ys), [r["candidate"] + (" *" if r["candidate"] == result["recommended"] else "")
                             for r in rows], fontsize=7)
    ax.set_xlabel(f"sustained load per GPU ({result.get('unit', '')}); hatched: screening sample only; "
                  "| a finalist's screen")
    ax.set_title("warmpath plan (* recommended)")
    from matplotlib.patches import Patch

    kinds = {r["kind"] for r in rows}
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items() if k in kinds], loc="lower right",
              fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def topology_json(row: dict) -> str:
    """The row as a ``--topology FILE.json`` for ``warmpath sim`` / ``serve``."""
    return json.dumps({"policy": row.get("policy", row["kind"]), "ppd": row["ppd"], "workers": row["workers"]})


def write(out: Path, result: dict) -> None:
    """Every file of the plan into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(result, indent=1, default=str))
    rows = table(result)
    with open(out / "plan.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (out / "plan.md").write_text(_markdown(result, rows))
    plot(result, out / "plan.png")
    for key in ("recommended", "runner_up"):
        row = next((r for r in result["rows"] if r["candidate"] == result[key]), None)
        if row is not None:
            (out / f"{key.replace('_', '-')}.json").write_text(topology_json(row) + "\n")

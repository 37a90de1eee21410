"""The heatmaps of ``warmpath map`` (``sim/map.py``): one PNG per comparison, a grid of
facets (rows × columns of the first two dimensions), each a heatmap of the last two; colour
is the gain on a log scale centred at 1.0 (diverging), each cell annotated, the seed's
operating point outlined. Reads only ``map.json``'s content."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

LABELS = {"answer": "answer tokens", "split": "P:D nodes", "cold_share": "cold share",
          "cold_tokens": "cold document tokens", "link_gbps": "link Gb/s", "load": "sessions/s",
          "history": "history tokens", "append": "append tokens"}
TITLES = {"cpd_vs_pd": "CPD / PD sustained rate", "cpd_vs_pd-kv": "CPD / pd-kv sustained rate",
          "dynamic_vs_x0": "PPD dynamic: turn-2+ TTFT p50 x=0 / dynamic",
          "x1_vs_x0": "PPD x=1: turn-2+ TTFT p50 x=0 / x=1"}
CLIP = 3.0                      # log2 of the largest gain (and 1 / it) the colours tell apart
_SIGN = {"=": "", ">": ">", "<": "<", ">=": "≥", "<=": "≤"}


def fmt_value(v) -> str:
    """Axis labels: 65536 → 64K, 0.2 → 0.2, "2P1D" as is."""
    if isinstance(v, str):
        return v
    if v >= 1024 and v % 1024 == 0:
        return f"{int(v) // 1024}K"
    return f"{v:g}"


def cell_text(gain: dict) -> str:
    """The annotation: ``1.50``, ``>2.00`` (a bound), ``13.4``, ``1353``, ``n/a``."""
    if gain["value"] is None:
        return "n/a"
    v = gain["value"]
    return f"{_SIGN[gain['bound']]}{v:.0f}" if v >= 99.5 else f"{_SIGN[gain['bound']]}{v:.{1 if v >= 9.995 else 2}f}"


def fmt_seconds(s: float | None) -> str:
    """A TTFT: ``28 ms``, ``1.49 s``, ``37.7 s``, ``-`` (none)."""
    if s is None:
        return "-"
    if s < 0.9995:
        return f"{s * 1000:.3g} ms"
    return f"{s:.3g} s"


def arm_text(result: dict, cell: dict, comparison: str) -> str:
    """The two measurements behind a gain, new then baseline: CPD's sustained sessions/s per
    GPU with the grid's cut shown (``<0.2``: not even the lowest rate; ``≥0.8``: the highest,
    may go higher), PPD's turn-2+ TTFT p50."""
    new, base = result["comparisons"][comparison]
    if result["kind"] == "cpd":
        rates = result["config"]["rates"]

        def one(v):
            return f"<{min(rates):g}" if v is None else f"≥{v:g}" if v == max(rates) else f"{v:g}"
        return f"{one(cell['arms'][new]['sustained'])} vs {one(cell['arms'][base]['sustained'])}"
    return (f"{fmt_seconds(cell['arms'][new]['turn2_ttft_p50_s'])} vs "
            f"{fmt_seconds(cell['arms'][base]['turn2_ttft_p50_s'])}")


def facet_title(dim: str, v) -> str:
    """A facet's value with its unit: ``128-token answers``, ``2P1D nodes (P:D)``, ``50 Gb/s link``."""
    return {"answer": "{}-token answers", "split": "{} nodes (P:D)", "cold_share": "{} cold",
            "cold_tokens": "{}-token cold documents", "link_gbps": "{} Gb/s link", "load": "{} sessions/s",
            "history": "{}-token history", "append": "{}-token append"}[dim].format(fmt_value(v))


def settings_text(result: dict) -> str:
    """The simulation's settings, for the figure's title (``map.json``'s ``config`` has all)."""
    c = result["config"]
    run = f"{c['duration_s']:g} s simulated per point after a {c['ramp_s']:g} s ramp, seed {c['seed']}"
    if result["kind"] == "cpd":
        fixed = c.get("max_in_flight", 24)   # map.json files before the derived limit all had 24
        admitted = "admission sized to the fleet" if fixed is None else f"{fixed} admitted in flight"
        return (f"B200 Llama-3.1-8B, TP4 prefill-type nodes, 4 TP1 decoders per D node; "
                f"{fmt_value(c['context_tokens'])}-token warm repositories, {admitted}; "
                f"{run}")
    return f"H100 Llama-3.1-8B, {c['ppd_split']} TP1 workers; 2-turn sessions, {c['ppd_answer']}-token answers; {run}"


def colorbar_ticks(lim: float) -> list[float]:
    """The gains to mark on a colour bar spanning ``2 ** ±lim``: powers of 2 once it reaches
    2×, else the finer steps within it (so a bar up to 1.5× still shows more than 1×)."""
    steps = (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8) if lim >= 1 - 1e-9 else (2 / 3, 0.8, 1, 1.25, 1.5)
    return [v for v in steps if abs(math.log2(v)) <= lim + 1e-9]


def _matrix(result: dict, row, col) -> list[list[dict]]:
    """The cells of one facet, rows by y value, columns by x value."""
    (rd, cd, yd, xd) = [d["name"] for d in result["dims"]]
    ys, xs = result["dims"][2]["values"], result["dims"][3]["values"]
    found = {(c[yd], c[xd]): c for c in result["cells"] if c[rd] == row and c[cd] == col}
    return [[found[(y, x)] for x in xs] for y in ys]


def plot_comparison(result: dict, comparison: str, path: Path) -> Path:
    """One figure: facets of heatmaps of ``cells[*].gain[comparison]``."""
    rows, cols, ys, xs = (d["values"] for d in result["dims"])
    names = [d["name"] for d in result["dims"]]
    values = [g["value"] for c in result["cells"] for g in [c["gain"][comparison]] if g["value"]]
    top = max([abs(math.log2(v)) for v in values] + [math.log2(1.25)])
    lim = min(top, CLIP)        # beyond 8x the colour saturates; the annotation still says how far
    norm, cmap = Normalize(-lim, lim), plt.get_cmap("RdBu").with_extremes(bad="lightgrey")
    fig, axes = plt.subplots(len(rows), len(cols), squeeze=False, layout="constrained",
                             figsize=(max(6.0, 1.5 + 1.1 * len(xs) * len(cols)), 1.2 + 1.0 * len(ys) * len(rows)))
    op = result["operating_point"]["cell"]
    for i, row in enumerate(rows):
        for j, col in enumerate(cols):
            ax, cm = axes[i][j], _matrix(result, row, col)
            m = [[c["gain"][comparison] for c in line] for line in cm]
            data = [[math.log2(g["value"]) if g["value"] else float("nan") for g in line] for line in m]
            im = ax.imshow(data, cmap=cmap, norm=norm, origin="lower", aspect="auto")
            for y, line in enumerate(m):
                for x, g in enumerate(line):
                    dark = g["value"] and abs(math.log2(g["value"])) > 0.6 * lim
                    ax.text(x, y + 0.05, cell_text(g), ha="center", va="bottom", fontsize=9, weight="bold",
                            color="white" if dark else "black")
                    ax.text(x, y - 0.05, arm_text(result, cm[y][x], comparison), ha="center", va="top",
                            fontsize=6.5, color="white" if dark else "black")
            if op[names[0]] == row and op[names[1]] == col:
                y, x = ys.index(op[names[2]]), xs.index(op[names[3]])
                ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, lw=3, ec="gold"))
            ax.set_xticks(range(len(xs)), [fmt_value(v) for v in xs], fontsize=7)
            ax.set_yticks(range(len(ys)), [fmt_value(v) for v in ys], fontsize=7)
            ax.set_title(f"{facet_title(names[0], row)}, {facet_title(names[1], col)}", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel(LABELS[names[3]], fontsize=8)
            if j == 0:
                ax.set_ylabel(LABELS[names[2]], fontsize=8)
    ticks = colorbar_ticks(lim)
    bar = fig.colorbar(im, ax=axes, shrink=0.8, ticks=[math.log2(v) for v in ticks], label="gain (log scale)",
                       extend="both" if top > lim else "neither")
    bar.ax.set_yticklabels([f"{v:.3g}×" for v in ticks], fontsize=7)
    where = "exact" if result["operating_point"]["exact"] else "nearest cell"
    new, base = result["comparisons"][comparison]
    fig.suptitle(f"{TITLES[comparison]} (>1: {new} better; small print: {new} vs {base})\n"
                 f"{textwrap.fill(result['metric'], 100)}\n{textwrap.fill(settings_text(result), 100)}\n"
                 + textwrap.fill(f"gold: {result['operating_point']['label']} ({where})", 100), fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_map(result: dict, out: Path) -> list[Path]:
    """``<comparison>.png`` for every comparison of the map, under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return [plot_comparison(result, name, out / f"{name}.png") for name in result["comparisons"]]

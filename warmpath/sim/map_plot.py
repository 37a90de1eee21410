"""The heatmaps of ``warmpath map`` (``sim/map.py``): one PNG per comparison, a grid of
facets (rows: CPD's TPOT targets × the first dimension; columns: the second), each a heatmap
of the last two; colour is the gain on a log scale centred at 1.0 (diverging), each cell
annotated, the seed's operating point outlined. CPD adds ``winner.png``: per facet cell the
arm with the highest goodput. Reads only ``map.json``'s content."""

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
TITLES = {"cpd_vs_pd": "CPD / PD goodput", "cpd_vs_pd-kv": "CPD / pd-kv goodput",
          "cpd_vs_replica": "CPD / TP4 replicas goodput",
          "goodput_vs_cpd": "goodput policy / CPD goodput", "goodput_vs_pd": "goodput policy / PD goodput",
          "goodput_vs_replica": "goodput policy / TP4 replicas goodput",
          "goodput-replica_vs_pd": "goodput, cold tier + TP4 replicas / PD goodput",
          "goodput-replica_vs_replica": "goodput, cold tier + TP4 replicas / TP4 replicas goodput",
          "goodput-replica-e_vs_replica": "goodput, cold tier + TP4 replicas, elastic roles / TP4 replicas goodput",
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


def rate_text(rates: list, v: float | None) -> str:
    """A goodput with the grid's cut shown: ``<0.2`` (not even the lowest rate), ``≥0.8`` (the
    highest, may go higher)."""
    return f"<{min(rates):g}" if v is None else f"≥{v:g}" if v == max(rates) else f"{v:g}"


def gain_of(cell: dict, comparison: str, label: str | None) -> dict:
    """A cell's gain for ``comparison``: CPD's per TPOT target ``label``, PPD's own."""
    g = cell["gain"][comparison]
    return g if label is None else g[label]


def tpot_title(label: str | None) -> str:
    """``no TPOT target`` / ``TPOT p90 <= 1.3x unloaded`` (``""``: PPD, no targets)."""
    return "" if label is None else "no TPOT target" if label == "none" else f"TPOT ≤ {label}× unloaded"


def arm_text(result: dict, cell: dict, comparison: str, label: str | None = None) -> str:
    """The two measurements behind a gain, new then baseline: CPD's goodput (sessions/s per
    GPU, :func:`rate_text`) under TPOT target ``label``, PPD's turn-2+ TTFT p50."""
    new, base = result["comparisons"][comparison]
    if result["kind"] == "cpd":
        rates = result["config"]["rates"]
        return (f"{rate_text(rates, cell['arms'][new][label]['goodput'])} vs "
                f"{rate_text(rates, cell['arms'][base][label]['goodput'])}")
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


def facets(result: dict, draw, width: float = 1.1):
    """A figure of facets — rows: TPOT target (CPD) × the first dimension, columns: the
    second — each drawn by ``draw(ax, matrix, label)``, ticked, titled and the seed's point
    outlined; returns ``(fig, axes)``."""
    rows, cols, ys, xs = (d["values"] for d in result["dims"])
    names = [d["name"] for d in result["dims"]]
    frows = [(lab, row) for lab in (result.get("tpot_targets") or [None]) for row in rows]
    fig, axes = plt.subplots(len(frows), len(cols), squeeze=False, layout="constrained",
                             figsize=(max(6.0, 1.5 + width * len(xs) * len(cols)), 1.2 + 1.0 * len(ys) * len(frows)))
    op = result["operating_point"]["cell"]
    for i, (lab, row) in enumerate(frows):
        for j, col in enumerate(cols):
            ax = axes[i][j]
            draw(ax, _matrix(result, row, col), lab)
            if op[names[0]] == row and op[names[1]] == col:
                y, x = ys.index(op[names[2]]), xs.index(op[names[3]])
                ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, lw=3, ec="gold"))
            ax.set_xticks(range(len(xs)), [fmt_value(v) for v in xs], fontsize=7)
            ax.set_yticks(range(len(ys)), [fmt_value(v) for v in ys], fontsize=7)
            head = f"{tpot_title(lab)}\n" if lab is not None else ""
            ax.set_title(f"{head}{facet_title(names[0], row)}, {facet_title(names[1], col)}", fontsize=8)
            if i == len(frows) - 1:
                ax.set_xlabel(LABELS[names[3]], fontsize=8)
            if j == 0:
                ax.set_ylabel(LABELS[names[2]], fontsize=8)
    return fig, axes


def _suptitle(fig, result: dict, head: str) -> None:
    where = "exact" if result["operating_point"]["exact"] else "nearest cell"
    fig.suptitle(f"{head}\n{textwrap.fill(result['metric'], 100)}\n{textwrap.fill(settings_text(result), 100)}\n"
                 + textwrap.fill(f"gold: {result['operating_point']['label']} ({where})", 100), fontsize=7)


def plot_comparison(result: dict, comparison: str, path: Path) -> Path:
    """One figure: facets of heatmaps of each cell's gain for ``comparison``."""
    labels = result.get("tpot_targets") or [None]
    values = [g["value"] for c in result["cells"] for lab in labels
              for g in [gain_of(c, comparison, lab)] if g["value"]]
    top = max([abs(math.log2(v)) for v in values] + [math.log2(1.25)])
    lim = min(top, CLIP)        # beyond 8x the colour saturates; the annotation still says how far
    norm, cmap = Normalize(-lim, lim), plt.get_cmap("RdBu").with_extremes(bad="lightgrey")
    drawn = []

    def draw(ax, cm, lab):
        m = [[gain_of(c, comparison, lab) for c in line] for line in cm]
        data = [[math.log2(g["value"]) if g["value"] else float("nan") for g in line] for line in m]
        drawn.append(ax.imshow(data, cmap=cmap, norm=norm, origin="lower", aspect="auto"))
        for y, line in enumerate(m):
            for x, g in enumerate(line):
                dark = g["value"] and abs(math.log2(g["value"])) > 0.6 * lim
                ax.text(x, y + 0.05, cell_text(g), ha="center", va="bottom", fontsize=9, weight="bold",
                        color="white" if dark else "black")
                ax.text(x, y - 0.05, arm_text(result, cm[y][x], comparison, lab), ha="center", va="top",
                        fontsize=6.5, color="white" if dark else "black")

    fig, axes = facets(result, draw)
    ticks = colorbar_ticks(lim)
    bar = fig.colorbar(drawn[-1], ax=axes, shrink=0.8, ticks=[math.log2(v) for v in ticks], label="gain (log scale)",
                       extend="both" if top > lim else "neither")
    bar.ax.set_yticklabels([f"{v:.3g}×" for v in ticks], fontsize=7)
    new, base = result["comparisons"][comparison]
    _suptitle(fig, result, f"{TITLES[comparison]} (>1: {new} better; small print: {new} vs {base})")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


ARM_COLORS = {"cpd": "tab:blue", "pd": "tab:orange", "pd-kv": "tab:green", "replica": "tab:red", "goodput": "tab:purple", "goodput-replica": "tab:brown",
              "goodput-replica-e": "tab:pink"}


def winner_text(w: dict, rates: list) -> tuple[str, str]:
    """A cell of ``winner.png``: the winning arm(s) (``pd=pd-kv`` for a tie, ``none``) and,
    below, its goodput and the runner-up's (``0.6 (next 0.4)``)."""
    if not w["arms"]:
        return "none", f"<{min(rates):g}"
    nxt = "" if w["runner_up"] is None else f" (next {rate_text(rates, w['runner_up'])})"
    return "=".join(w["arms"]), rate_text(rates, w["goodput"]) + nxt


def plot_winner(result: dict, path: Path) -> Path:
    """CPD: per cell and TPOT target, the arm with the highest goodput (grey: a tie, light
    grey: no arm sustains the lowest rate), annotated with its goodput and the runner-up's."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    rates = result["config"]["rates"]

    def colour(w):
        return to_rgb("lightgrey" if not w["arms"] else ARM_COLORS[w["arms"][0]] if len(w["arms"]) == 1 else "grey")

    def draw(ax, cm, lab):
        ws = [[c["winner"][lab] for c in line] for line in cm]
        ax.imshow([[colour(w) for w in line] for line in ws], origin="lower", aspect="auto", alpha=0.55)
        for y, line in enumerate(ws):
            for x, w in enumerate(line):
                top, low = winner_text(w, rates)
                ax.text(x, y + 0.05, top, ha="center", va="bottom", fontsize=8, weight="bold")
                ax.text(x, y - 0.05, low, ha="center", va="top", fontsize=6.5)

    fig, _ = facets(result, draw, width=1.3)
    fig.legend(handles=[Patch(color=ARM_COLORS[a], alpha=0.55, label=a) for a in result["arms"]]
               + [Patch(color="grey", alpha=0.55, label="tie")], loc="outside lower center", ncol=5, fontsize=7)
    _suptitle(fig, result, "Highest goodput among " + ", ".join(result["arms"]) + " (sessions/s per GPU)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_map(result: dict, out: Path) -> list[Path]:
    """``<comparison>.png`` for every comparison of the map (CPD: and ``winner.png``), under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_comparison(result, name, out / f"{name}.png") for name in result["comparisons"]]
    return paths + ([plot_winner(result, out / "winner.png")] if result["kind"] == "cpd" else [])

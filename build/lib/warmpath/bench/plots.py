"""PNG plots in the style of the CPD blog's figure 4 and the PPD paper's turn-2 figures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _numeric_rates(summary: dict) -> list[tuple[float, str]]:
    out = []
    for k in summary["rates"]:
        try:
            out.append((float(k), k))
        except ValueError:
            pass
    return sorted(out)


def _figure(summaries: dict[str, dict], panels: list, path: Path) -> Path:
    """One panel per (title, value-of(summary, rate key)), one line per configuration."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    for ax, (title, value) in zip(axes, panels):
        for label, s in summaries.items():
            pts = [(r, value(s, k)) for r, k in _numeric_rates(s)]
            pts = [(r, y) for r, y in pts if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel("target rate (req/s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_summaries(summaries: dict[str, dict], out: Path, gpus: int = 1) -> list[Path]:
    """One line per configuration (label → summary). Writes ``cpd_fig4.png`` (TTFT p50,
    TTFT p90, prefill throughput per GPU, achieved QPS per GPU vs target rate) and
    ``ppd_turn2.png`` (turn-2+ TTFT and TPOT vs rate). Needs ≥ 1 numeric rate."""
    if not any(_numeric_rates(s) for s in summaries.values()):
        return []
    out.mkdir(parents=True, exist_ok=True)
    cpd = [("TTFT p50 (s)", lambda s, k: s["rates"][k]["all"]["ttft_p50_s"]),
           ("TTFT p90 (s)", lambda s, k: s["rates"][k]["all"]["ttft_p90_s"]),
           ("prefill tok/s per GPU", lambda s, k: s["rates"][k]["all"]["prompt_tokens"]
            / s["runs"][k]["duration_s"] / gpus),
           ("achieved QPS per GPU", lambda s, k: s["runs"][k]["achieved_rps"] / gpus)]
    ppd = [("turn 2+ TTFT p50 (s)", lambda s, k: s["rates"][k]["turn2+"]["ttft_p50_s"]),
           ("turn 2+ TPOT (s)", lambda s, k: s["rates"][k]["turn2+"]["tpot_s"])]
    p1 = _figure(summaries, cpd, out / "cpd_fig4.png")
    p2 = _figure(summaries, ppd, out / "ppd_turn2.png")
    return [p1, p2]

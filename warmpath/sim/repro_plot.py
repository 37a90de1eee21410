"""``warmpath repro``'s figures with the seeds' numbers drawn beside ours
(``sim/seed_numbers.py``): bands for reported ranges, dashed lines for single values."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from warmpath.sim.seed_numbers import CPD, PPD  # noqa: E402


def _band(ax, v, label: str, color: str, scale: float = 1.0) -> None:
    if v.lo == v.hi:
        ax.axhline(v.lo * scale, ls="--", color=color, lw=1.2, label=label)
    elif v.hi == float("inf"):
        ax.axhline(v.lo * scale, ls=":", color=color, lw=1.2, label=label)
    else:
        ax.axhspan(v.lo * scale, v.hi * scale, color=color, alpha=0.15, label=label)


def cpd_figure(table: dict, path: Path) -> Path:
    """Achieved QPS/GPU and TTFT p50 vs target QPS/GPU per configuration, with the blog's
    plateaus (2P1D 0.75–0.8, CPD 1.1–1.15) as bands and its "p50 > 1 s" as a line."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, t in table.items():
        if name.startswith("gain_"):
            continue
        rates = sorted(t["achieved_qps_per_gpu"], key=float)
        a1.plot([float(r) for r in rates], [t["achieved_qps_per_gpu"][r] for r in rates], marker="o", label=name)
        a2.plot([float(r) for r in rates], [t["ttft_p50_s"][r] for r in rates], marker="o", label=name)
    _band(a1, CPD["plateau_qps_per_gpu"]["2P1D"], "blog: 2P1D plateau", "tab:blue")
    _band(a1, CPD["plateau_qps_per_gpu"]["CPD-1D"], "blog: CPD plateau", "tab:green")
    _band(a2, CPD["ttft_p50_near_saturation_s"]["2P1D"], "blog: 2P1D p50 > 1 s near saturation", "tab:blue")
    a1.set(xlabel="target QPS/GPU", ylabel="achieved QPS/GPU", title="throughput (blog fig. 4, bottom left)")
    a2.set(xlabel="target QPS/GPU", ylabel="TTFT p50 (s)", yscale="log", title="TTFT p50 (blog fig. 4, top left)")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def ppd_figure(table: dict, sweep: dict | None, path: Path, sweep_point: str = "") -> Path:
    """Left: turn-2 TTFT p50 change vs x=0 of x=1 and dynamic per split over the rates, with
    the paper's Table 1 range (−48…−73%) and PPD's −68% average. Right: the bandwidth sweep
    (PD = x=0, PPD = dynamic, ms; ``sweep_point`` names where ours ran) with figure 5's PD
    143.7–170.6 ms and PPD ≈ 51 ms (1P3D, 1 QPS)."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    points = {k.rsplit("-", 1)[0] for k in table}
    splits = sorted({p.split("/")[1] for p in points})
    for i, split in enumerate(splits):
        rates = sorted((float(p.split("/")[0]), p) for p in points if p.endswith("/" + split))
        for mode, ls in (("x1", "--"), ("dynamic", "-")):
            pts = [(r, table[f"{p}-{mode}"]["turn2_ttft_p50_s"] / table[f"{p}-x0"]["turn2_ttft_p50_s"] - 1)
                   for r, p in rates if f"{p}-{mode}" in table and f"{p}-x0" in table]
            if pts:
                a1.plot([x for x, _ in pts], [y * 100 for _, y in pts], ls=ls, marker="o", color=f"C{i}",
                        label=f"{split} {mode}")
    _band(a1, PPD["x1_turn2_ttft_change"], "paper: x=1 (Table 1)", "tab:orange", 100)
    _band(a1, PPD["ppd_turn2_ttft_change_avg"], "paper: PPD average", "tab:green", 100)
    a1.set(xlabel="sessions/s", ylabel="turn-2 TTFT p50 vs x=0 (%)", title="x=1 / dynamic vs x=0")
    if sweep:
        gs = sorted(sweep, key=float)
        for side in ("PD", "PPD"):
            a2.plot([float(g) for g in gs], [sweep[g][side] * 1e3 for g in gs], marker="o", label=f"ours {side}")
        a2.set_xscale("log")
        a2.set_xticks([float(g) for g in gs], [f"{float(g):g}" for g in gs])
        a2.minorticks_off()
    _band(a2, PPD["fig5_pd_turn2_ttft_ms"], "paper: PD (fig. 5, its bandwidths unstated)", "tab:blue")
    _band(a2, PPD["fig5_ppd_turn2_ttft_ms"], "paper: PPD ≈ 51 ms", "tab:orange")
    a2.set(xlabel="NIC Gb/s", ylabel="turn-2 TTFT p50 (ms)",
           title=f"network sweep{' at ' + sweep_point if sweep_point else ''} (paper fig. 5: 1P3D, 1 QPS)")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

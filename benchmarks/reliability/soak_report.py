"""The soak's verdict from its samples: drift per series, what is bounded by design, the table
and the plot (benchmarks/reliability/soak.py runs it; no I/O here but the PNG).

A series is a list of ``(t, value)`` points, ``t`` in seconds from the start of the load.
After a warm-up (the first ``warmup_frac`` of the run) its mean over the next ``window_frac``
of the run (*early*) is compared with its mean over the last ``window_frac`` (*late*):
``drift = late / early - 1``. Growth beyond ``limit`` is flagged; a series that is bounded by
design (a pool filling up to its capacity, sessions waiting for their idle expiry) carries a
note saying why it may grow and up to what.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

MIB = 1 << 20
Points = list[tuple[float, float]]

# series name prefix -> why it may grow although nothing leaks (the bound)
BOUNDED = {
    "sessions": "bounded by design: a session is forgotten after the router's --session-idle-s (default "
                "3600 s, longer than a 30 min run) or beyond 100,000; it grows with new sessions until then",
    "index/local": "bounded: mirrors every worker's L1 + L2 pool (their block capacity)",
    "index/l3": "bounded: mirrors the Mooncake store (its capacity)",
    "index/approx": "bounded: blocks routed within the index TTL (120 s), at most 2^20 per worker",
    "kv_blocks/": "bounded: at most the tier's capacity (it fills, then evicts)",
}
LOAD = {"kv_blocks_in_use": "follows the load: blocks held by running requests (0 when idle, checked after)",
        "rss_mib/worker": "includes the worker's KV pools, committed page by page as they first fill (up to "
                          "their capacity): judged without them (rss_minus_kv_mib)",
        "fds/router": "follows the load: keep-alive connections to the workers; judged at idle (before the "
                      "load vs after the drain)"}


def without_kv(series: dict[str, Points]) -> dict[str, Points]:
    """``rss_minus_kv_mib/worker W``: each worker's RSS less the KV pool memory committed so
    far — per tier, the most blocks it has held at once (cached + in use) times the block size
    (``capacity_bytes`` / ``capacity``). A pool's pages stay committed once written, so what
    is left is the worker's own memory, which must not grow."""
    out = {}
    for k, pts in series.items():
        if not k.startswith("rss_mib/worker "):
            continue
        w = k.removeprefix("rss_mib/worker ")
        tiers = [t.split("/")[-1] for t in series if t.startswith(f"capacity/{w}/")]
        block_mib = {t: series[f"capacity_bytes/{w}/{t}"][-1][1] / series[f"capacity/{w}/{t}"][-1][1] / MIB
                     for t in tiers if series.get(f"capacity_bytes/{w}/{t}") and series[f"capacity/{w}/{t}"][-1][1]}
        held = {t: {tt: v for tt, v in series.get(f"kv_blocks/{w}/{t}/cached", [])} for t in block_mib}
        used = {t: {tt: v for tt, v in series.get(f"kv_blocks/{w}/{t}/in_use", [])} for t in block_mib}
        peak, rows = dict.fromkeys(block_mib, 0.0), []
        for t, rss in pts:
            for tier in block_mib:
                peak[tier] = max(peak[tier], held[tier].get(t, 0.0) + used[tier].get(t, 0.0))
            rows.append((t, rss - sum(peak[tier] * block_mib[tier] for tier in block_mib)))
        if block_mib:
            out[f"rss_minus_kv_mib/worker {w}"] = rows
    return out


def idle_fds(series: dict[str, Points], limit: float = 0.05) -> dict[str, tuple[float, float, bool]]:
    """For descriptor counts that follow the load (the router's): the first sample (before the
    load) and the last (after the drain), ``(before, after, grew by more than limit)``. The
    others are judged by their drift: the workers open their store connections after t = 0."""
    return {k: (p[0][1], p[-1][1], p[-1][1] > p[0][1] * (1 + limit)) for k, p in sorted(series.items())
            if k.startswith("fds/") and p and note_for(k) == LOAD["fds/router"]}


@dataclass(frozen=True)
class Drift:
    """One series: its means over the early and late windows and their relative change."""

    early: float | None        # mean over the window right after warm-up
    late: float | None         # mean over the last window
    drift: float | None        # late / early - 1; None without samples in both, or from 0 to > 0
    flagged: bool              # grew by more than the limit (from 0 to anything counts)
    note: str = ""             # why it may grow by design, if it may


def windows(duration: float, warmup_frac: float, window_frac: float = 0.2) -> tuple[tuple[float, float], ...]:
    """``(early, late)`` windows as ``(start, end)`` seconds: right after the warm-up, and the
    last ``window_frac`` of the run."""
    if not 0 <= warmup_frac <= 1 - 2 * window_frac:
        raise ValueError(f"warm-up fraction must be in [0, {1 - 2 * window_frac:g}], got {warmup_frac}")
    w0 = warmup_frac * duration
    return (w0, w0 + window_frac * duration), ((1 - window_frac) * duration, duration)


def mean_in(points: Points, lo: float, hi: float) -> float | None:
    """Mean of the values with ``lo <= t <= hi``; None when there are none."""
    xs = [v for t, v in points if lo <= t <= hi]
    return sum(xs) / len(xs) if xs else None


def note_for(name: str) -> str:
    """Why series ``name`` may grow by design ("" when it should stay flat)."""
    if name.startswith("kv_blocks/") and name.endswith("/in_use"):
        return LOAD["kv_blocks_in_use"]
    if name.startswith("rss_mib/worker"):
        return LOAD["rss_mib/worker"]
    if name == "fds/router":
        return LOAD["fds/router"]
    return next((why for prefix, why in BOUNDED.items() if name.startswith(prefix)), "")


def drift_of(points: Points, early: tuple[float, float], late: tuple[float, float], limit: float = 0.05,
             note: str = "") -> Drift:
    """The drift of one series between the two windows (see the module docstring)."""
    a, b = mean_in(points, *early), mean_in(points, *late)
    if a is None or b is None:
        return Drift(a, b, None, False, note)
    if a == 0:
        return Drift(a, b, 0.0 if b == 0 else None, b > 0, note)
    d = b / a - 1
    return Drift(a, b, d, d > limit, note)


def drifts(series: dict[str, Points], duration: float, warmup_frac: float, limit: float = 0.05) -> dict[str, Drift]:
    """:func:`drift_of` for every series but the load (``load/*``: requests in flight, waiting,
    running; plotted, not judged), with its note."""
    early, late = windows(duration, warmup_frac)
    return {k: drift_of(p, early, late, limit, note_for(k)) for k, p in sorted(series.items())
            if not k.startswith(("load/", "capacity"))}


def fill_times(series: dict[str, Points], full: float = 0.95) -> dict[str, float | None]:
    """``worker/tier`` -> when its cached blocks first reached ``full`` of its capacity (None:
    never). Until then its pool is still being committed, so the worker's RSS grows by design."""
    out = {}
    for k, cap in sorted(series.items()):
        if k.startswith("capacity/") and cap and cap[-1][1] > 0:
            wt = k.removeprefix("capacity/")
            pts = series.get(f"kv_blocks/{wt}/cached", [])
            out[wt] = next((t for t, v in pts if v >= full * cap[-1][1]), None)
    return out


def verdict(d: dict[str, Drift], requests: dict, fds: dict[str, tuple[float, float, bool]] | None = None) -> dict:
    """Which flagged series have no bound by design (the goal: none), descriptors left open at
    idle (none), and lost requests (0)."""
    unbounded = sorted(k for k, x in d.items() if x.flagged and not x.note)
    bounded = sorted(k for k, x in d.items() if x.flagged and x.note)
    fd_grew = sorted(k for k, (_, _, grew) in (fds or {}).items() if grew)
    return {"flagged_unbounded": unbounded, "flagged_bounded_by_design": bounded, "fds_grown_at_idle": fd_grew,
            "lost": requests["lost"], "goal_met": not unbounded and not fd_grew and requests["lost"] == 0}


def as_json(d: dict[str, Drift]) -> dict[str, dict]:
    """The drifts as plain dicts (for the result file)."""
    return {k: asdict(x) for k, x in d.items()}


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}"


def table(d: dict[str, Drift]) -> str:
    """One line per series: early and late means, drift, flag, and the bound if it has one."""
    lines = [f"{'series':<40}{'early':>12}{'late':>12}{'drift':>9}  flag"]
    for k, x in d.items():
        pct = "from 0" if x.drift is None and x.early == 0 and x.late else (
            "-" if x.drift is None else f"{100 * x.drift:+.1f}%")
        flag = ("GROWS" if not x.note else "grows (bounded)") if x.flagged else ""
        lines.append(f"{k:<40}{_fmt(x.early):>12}{_fmt(x.late):>12}{pct:>9}  {flag}")
    return "\n".join(lines)


PANELS = (("rss_mib/", "RSS (MiB) per process"),
          ("rss_minus_kv_mib/", "worker RSS less the KV pool pages committed so far (MiB)"),
          ("fds/", "open file descriptors per process"),
          ("kv_blocks/", "KV blocks per worker / tier / state"), ("index/", "router KV index (block hashes)"),
          ("sessions", "router sessions"), ("load/", "load (router in flight, waiting)"))


def plot(series: dict[str, Points], duration: float, warmup_frac: float, path: Path, title: str) -> Path:
    """One panel per kind of series over time; the warm-up shaded, the two windows marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    early, late = windows(duration, warmup_frac)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(11, 3.2 * len(PANELS)), sharex=True)
    for ax, (prefix, label) in zip(axes, PANELS):
        for k, pts in sorted(series.items()):
            if k.startswith(prefix) and pts:
                ax.plot([t for t, _ in pts], [v for _, v in pts], label=k.removeprefix(prefix) or k, lw=1.2)
        ax.axvspan(0, early[0], color="grey", alpha=0.15)
        for lo, hi in (early, late):
            ax.axvspan(lo, hi, color="tab:green", alpha=0.08)
        ax.axvline(duration, color="black", ls=":", lw=1)     # arrivals end; the drain follows
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", ncol=3)
    axes[-1].set_xlabel("seconds since the load started (grey: warm-up; green: the windows compared; "
                        "dotted: last arrival, the drain follows)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path

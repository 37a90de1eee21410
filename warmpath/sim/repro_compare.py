"""``warmpath repro``'s "seed vs ours" tables: each of the seed's reported values
(``sim/seed_numbers.py``) beside what the simulation got at the same point (pure, no torch).

A row is ``{"point", "metric", "unit", "seed", "seed_source", "ours", "within"}``: ``seed``
is the seed's value as text, ``ours`` a number in ``unit`` (``%`` rows are fractions),
``within`` whether ours falls in the seed's range (a single reported value: within
``POINT_TOL`` of it, relative), None where the seed gives no number or we have none.
"""

from __future__ import annotations

from statistics import mean

from warmpath.sim.seed_numbers import CPD, PPD, SeedValue

POINT_TOL = 0.1       # a single reported value counts as met within ±10% of it
SATURATED = 0.95      # a configuration is saturated once it achieves this share of its plateau


def _row(point: str, metric: str, seed: SeedValue | None, ours: float | None, unit: str | None = None) -> dict:
    tol = POINT_TOL if seed is not None and seed.lo == seed.hi else 0.0
    return {"point": point, "metric": metric, "unit": unit or (seed.unit if seed else ""),
            "seed": seed.text() if seed else None, "seed_source": seed.source if seed else None,
            "ours": ours, "within": seed.holds(ours, tol) if seed else None}


def saturation_rate(achieved: dict[str, float]) -> str | None:
    """The lowest target rate (a key of ``achieved``) whose achieved QPS/GPU is at least
    :data:`SATURATED` of the highest achieved; None if empty."""
    if not achieved:
        return None
    top = max(achieved.values())
    return min((k for k, v in achieved.items() if v >= SATURATED * top), key=float)


def cpd_rows(table: dict) -> list[dict]:
    """``repro cpd``'s table (per configuration: ``achieved_qps_per_gpu`` and ``ttft_p50_s`` by
    target rate) against the blog: each configuration's plateau (the highest achieved), its
    TTFT p50 where it saturates (:func:`saturation_rate`), CPD's gain on the plateau."""
    rows, plateau = [], {}
    for name, t in table.items():
        if name.startswith("gain_"):
            continue
        plateau[name] = max(t["achieved_qps_per_gpu"].values()) if t["achieved_qps_per_gpu"] else None
        rows.append(_row(name, "plateau QPS/GPU (highest achieved)", CPD["plateau_qps_per_gpu"].get(name),
                         plateau[name], "QPS/GPU"))
        sat = saturation_rate(t["achieved_qps_per_gpu"])
        rows.append(_row(f"{name} @ {sat}", "TTFT p50 where saturated", CPD["ttft_p50_near_saturation_s"].get(name),
                         t["ttft_p50_s"].get(sat) if sat else None, "s"))
    for base, cpd in (("2P1D", "CPD-1D"), ("2P2D", "CPD-2D")):
        if plateau.get(base) and plateau.get(cpd) is not None:
            rows.append(_row(f"{cpd} vs {base}", "plateau gain", CPD["gain"], plateau[cpd] / plateau[base] - 1))
    return rows


def ppd_rows(table: dict, sweep: dict | None = None) -> list[dict]:
    """``repro ppd``'s points (``"rate/split-mode"`` → ``turn2_ttft_p50_s``) against the
    paper: x=1's and dynamic's turn-2 TTFT change vs x=0 per point and on average (Table 1's
    range; the −68% average), and the bandwidth sweep (``{gbps: {"PD", "PPD"}}`` in s)
    against figure 5's PD 143.7–170.6 ms and PPD ≈ 51 ms."""
    rows, change = [], {"x1": [], "dynamic": []}
    points = sorted({k.rsplit("-", 1)[0] for k in table}, key=lambda p: (float(p.split("/")[0]), p))
    for p in points:
        x0 = table.get(f"{p}-x0")
        for mode, seed in (("x1", PPD["x1_turn2_ttft_change"]), ("dynamic", PPD["ppd_turn2_ttft_change_avg"])):
            r = table.get(f"{p}-{mode}")
            if x0 is None or r is None:
                continue
            c = r["turn2_ttft_p50_s"] / x0["turn2_ttft_p50_s"] - 1
            change[mode].append(c)
            rows.append(_row(p, f"{mode} turn-2 TTFT p50 vs x=0", seed, c))
    for mode, seed in (("x1", PPD["x1_turn2_ttft_change"]), ("dynamic", PPD["ppd_turn2_ttft_change_avg"])):
        if change[mode]:
            rows.append(_row(f"mean of {len(change[mode])}", f"{mode} turn-2 TTFT p50 vs x=0", seed,
                             mean(change[mode])))
    for g, v in sorted((sweep or {}).items(), key=lambda kv: -float(kv[0])):
        for side, seed in (("PD", PPD["fig5_pd_turn2_ttft_ms"]), ("PPD", PPD["fig5_ppd_turn2_ttft_ms"])):
            ours = v.get(side)
            rows.append(_row(f"{g} Gb/s", f"{side} turn-2 TTFT p50", seed, None if ours is None else ours * 1e3))
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table: point, metric, seed, ours, within."""
    def f(x, unit):
        if x is None:
            return "-"
        return f"{x * 100:+.0f}%" if unit == "%" else f"{x:.3g} {unit}"
    out = ["| point | metric | seed | ours | within |", "|---|---|---|---|---|"]
    for r in rows:
        w = {True: "yes", False: "no", None: "-"}[r["within"]]
        out.append(f"| {r['point']} | {r['metric']} | {r['seed'] or '-'} | {f(r['ours'], r['unit'])} | {w} |")
    return "\n".join(out) + "\n"

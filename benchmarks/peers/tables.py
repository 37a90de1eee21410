"""The peer comparisons' Markdown tables (pure): ``warmpath bench`` summaries per server and
workload, and two servers side by side with their ratio (``vs_llamacpp.py``, ``vs_vllm.py``)."""

from __future__ import annotations

import statistics

Row = tuple[str, dict, bool]     # (label, value per server, lower is better)


def fmt(x: float | None) -> str:
    """Three decimals, ``-`` for a missing value."""
    return "-" if x is None else f"{x:.3f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, ``None`` when either is missing or ``b`` is 0."""
    return None if a is None or not b else a / b


def workload_table(results: dict) -> list[str]:
    """One row per (server, workload, rate) of ``{"server/workload": summary.json}``; cached =
    the share of prompt tokens the server reported as cached
    (``usage.prompt_tokens_details.cached_tokens``); attained = the share of requests that met
    the target on their own (``slo.py``)."""
    rows = ["| server | workload | rate | TTFT p50 s | TTFT p90 s | TPOT s | TPOT p90 s | out tok/s | cached | "
            "attained | failed |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, s in results.items():
        server, wl = key.split("/")
        for rate, cls in s["rates"].items():
            c = cls["all"]
            rows.append(f"| {server} | {wl} | {rate} | {fmt(c['ttft_p50_s'])} | {fmt(c['ttft_p90_s'])} | "
                        f"{fmt(c['tpot_s'])} | {fmt(c.get('tpot_p90_s'))} | {fmt(c['throughput_tok_s'])} | "
                        f"{fmt(ratio(c['cached_tokens'], c['prompt_tokens']))} | {fmt(c.get('attainment'))} | "
                        f"{c['failed']} |")
        rows.append(f"| {server} | {wl} | max rate meeting SLO | {s.get('max_rate_meeting_slo')} | | | | | | | |")
    return rows


def sustained_rows(summaries: dict[str, list[dict]], label: str) -> list[Row]:
    """``max_rate_meeting_slo`` of each server's runs (one per seed, in order), and their median
    when there are several (a run where no rate met the target counts as 0)."""
    n = max((len(v) for v in summaries.values()), default=0)
    rows = [(f"{label}, seed run {i + 1}" if n > 1 else label,
             {s: v[i].get("max_rate_meeting_slo") if i < len(v) else None for s, v in summaries.items()}, False)
            for i in range(n)]
    if n > 1:
        rows.append((f"{label}, median", {s: statistics.median(x.get("max_rate_meeting_slo") or 0.0 for x in v)
                                          if v else None for s, v in summaries.items()}, False))
    return rows


def compare_table(rows: list[Row], names: tuple[str, str]) -> list[str]:
    """The two servers ``names`` side by side, each row with ``names[0] / names[1]``."""
    a, b = names
    out = [f"| measurement | {a} | {b} | {a} / {b} |", "|---|---:|---:|---:|"]
    for label, v, lower in rows:
        r = ratio(v.get(a), v.get(b))
        out.append(f"| {label} ({'lower' if lower else 'higher'} is better) | {fmt(v.get(a))} | {fmt(v.get(b))} | "
                   f"{'-' if r is None else f'{r:.2f}'} |")
    return out

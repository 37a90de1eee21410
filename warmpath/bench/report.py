"""``report.html``: one self-contained page of a ``warmpath bench`` / ``warmpath sim`` run —
the per-rate tables of ``summary.json`` and the run's PNG plots inlined as base64 data URIs
(it opens from disk, without a server, and loads nothing else)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from warmpath.bench.metrics import CLASSES

COLUMNS = ("completed", "failed", "timed_out", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_s", "itl_s", "e2e_p50_s",
           "throughput_tok_s", "goodput_rps", "success_rate")
RUN_KEYS = ("achieved_rps", "duration_s", "tier_hit_ratio", "ttft_from", "trace_speed", "trace_left_out")
STYLE = """body{font:13px/1.4 system-ui,sans-serif;margin:1em 2em;color:#1d2330}
table{border-collapse:collapse;margin:.3em 0 1em}th,td{border:1px solid #dde1e7;padding:2px 8px;text-align:right}
th{background:#eef0f4}td.text,th.text{text-align:left}img{max-width:100%;border:1px solid #dde1e7;margin:.5em 0}
pre{background:#f6f7f9;padding:.5em;overflow:auto}"""


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return html.escape(", ".join(f"{k} {_cell(x)}" for k, x in v.items()))
    return html.escape(str(v))


def rate_table(rate: str, classes: dict, run: dict | None) -> str:
    """One rate point: a row per request class, then the run's own figures."""
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    rows = "".join(f'<tr class="cls" data-cls="{c}"><td class="text">{c}</td>'
                   + "".join(f'<td data-key="{k}">{_cell(classes[c].get(k))}</td>' for k in COLUMNS) + "</tr>"
                   for c in CLASSES if c in classes)
    extra = "".join(f"<li>{k}: {_cell(run[k])}</li>" for k in RUN_KEYS if run and k in run)
    return (f'<section class="rate" data-rate="{html.escape(rate)}"><h2>rate {html.escape(rate)} req/s</h2>'
            f'<table><thead><tr><th class="text">class</th>{head}</tr></thead><tbody>{rows}</tbody></table>'
            f"<ul>{extra}</ul></section>")


def plot_img(path: Path) -> str:
    """A PNG as an ``<img>`` with a data URI."""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><figcaption>{html.escape(path.name)}</figcaption><img alt="{html.escape(path.stem)}" ' \
           f'src="data:image/png;base64,{data}"></figure>'


def render_report(summary: dict, plots: list[Path], title: str) -> str:
    """The page's HTML for ``summary`` (``summary.json``'s dict) and ``plots`` (PNG files)."""
    runs = summary.get("runs", {})
    tables = "".join(rate_table(r, classes, runs.get(r)) for r, classes in summary["rates"].items())
    slo = summary.get("max_rate_meeting_slo", None)
    head = f"<p>max rate meeting the SLO: <b id=\"max-rate\">{_cell(slo)}</b></p>" \
        if "max_rate_meeting_slo" in summary else ""
    figures = "".join(plot_img(p) for p in plots)
    meta = {k: v for k, v in summary.items() if k not in ("rates", "runs")}
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{head}"
            f'<div id="tables">{tables}</div><h2>Plots</h2><div id="plots">{figures}</div>'
            f"<h2>Run</h2><pre id=\"meta\">{html.escape(json.dumps(meta, indent=1, default=str))}</pre>"
            "</body></html>\n")


def write_report(out: Path, summary: dict, plots: list[Path], title: str = "warmpath bench") -> Path:
    """Write ``out/report.html``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.html"
    path.write_text(render_report(summary, plots, title), encoding="utf-8")
    return path

"""``report.html`` (bench/report.py): from a real ``warmpath sim`` run (which writes it the way
``warmpath bench`` does), opened from disk in a real headless chromium; and by hand from a
summary dict."""

import json

from tests.browser import browser  # noqa: F401 - the fixture
from warmpath.bench.metrics import CLASSES
from warmpath.bench.report import render_report
from warmpath.cli import main

TABLES_JS = """return [...document.querySelectorAll('section.rate')].map(s => ({rate: s.dataset.rate,
  rows: [...s.querySelectorAll('tr.cls')].map(tr => [tr.dataset.cls,
    tr.querySelector('td[data-key=completed]').textContent])}))"""
IMAGES_JS = """return [...document.images].map(i => ({src: i.src.slice(0, 22), w: i.naturalWidth,
  done: i.complete}))"""


def test_report_of_a_sim_run_renders_its_tables_and_inlined_plots(tmp_path, browser):  # noqa: F811
    out = tmp_path / "sim"
    assert main(["sim", "--topology", "cpd-1d", "--hardware", "h100", "--workload", "coding-agent",
                 "--rates", "1,2", "--duration", "10", "--scale", "0.25", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    browser.get((out / "report.html").as_uri())
    tables = browser.js(TABLES_JS)
    assert [t["rate"] for t in tables] == ["1.0", "2.0"]
    for t in tables:
        assert t["rows"] == [[c, str(s["rates"][t["rate"]][c]["completed"])] for c in CLASSES]
    images = browser.wait_for(lambda: (i := browser.js(IMAGES_JS)) and all(x["done"] for x in i) and i, 10,
                              "plots did not load")
    assert [x["src"] for x in images] == ["data:image/png;base64,"] * 2
    assert all(x["w"] > 300 for x in images)           # decoded PNGs, from the page alone
    assert browser.js("return document.title").startswith("sim:cpd-1d/h100/")
    png = browser.screenshot(tmp_path / "report.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000


def test_report_cells_escape_and_format_the_summary():
    row = {k: None for k in ("ttft_p50_s", "tpot_s")} | {"completed": 7, "failed": 0, "ttft_p90_s": 0.123456}
    summary = {"target": "<b>x</b>", "rates": {"1.0": {"all": row}},
               "runs": {"1.0": {"achieved_rps": 0.98, "tier_hit_ratio": {"L1": 0.5}}}, "max_rate_meeting_slo": None}
    page = render_report(summary, [], "t & u")
    assert "<title>t &amp; u</title>" in page
    assert '<td data-key="completed">7</td>' in page and '<td data-key="ttft_p90_s">0.1235</td>' in page
    assert '<td data-key="ttft_p50_s">–</td>' in page and '<tr class="cls" data-cls="cold">' not in page
    assert "<li>achieved_rps: 0.98</li><li>tier_hit_ratio: L1 0.5</li>" in page
    assert '<b id="max-rate">–</b>' in page and "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page

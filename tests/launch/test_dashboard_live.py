"""The dashboard and the Grafana JSON against one real ``cpd-1d`` cluster (router, 3 workers
and Mooncake as processes): the page in a real headless chromium, read from its rendered
DOM; every metric the Grafana queries name is exposed by a live router or worker."""

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.browser import browser  # noqa: F401 - the fixture
from tests.conftest import AUTH, cluster_process
from warmpath.bench.prom import samples
from prometheus_client.parser import text_string_to_metric_families

GRAFANA = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "warmpath.json"
PROMPT = "The dashboard shows where every prompt token came from. " * 6
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def cluster():
    with cluster_process("cpd-1d") as base:
        yield base


def send_traffic(base: str) -> None:
    """Two text completions of one prompt, and a two-turn chat session (turn 2+), greedy."""
    for _ in range(2):
        r = httpx.post(base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0},
                       timeout=120)
        assert r.status_code == 200, r.text
    msgs = [{"role": "user", "content": "Name three colours."}]
    for _ in range(2):
        r = httpx.post(base + "/v1/chat/completions", headers={"x-session-id": "dash"}, timeout=120,
                       json={"messages": msgs, "max_tokens": 4, "temperature": 0, "stream": True})
        assert r.status_code == 200, r.text
        msgs += [{"role": "assistant", "content": "Red, green"}, {"role": "user", "content": "Two more."}]


WORKERS_JS = """return [...document.querySelectorAll('#workers tbody tr')].map(tr => ({
  id: tr.dataset.worker, role: tr.dataset.role, health: tr.querySelector('td.health').textContent}))"""
HEADERS_JS = "return [...document.querySelectorAll('#workers thead th')].map(th => th.textContent)"
POINTS_JS = "return Number(document.getElementById('chart-ttft').dataset.points || 0)"
LIMIT_JS = "return document.getElementById('admission-limit').textContent"
ROUTERS_JS = """return [document.getElementById('routers-agree').textContent,
  ...[...document.querySelectorAll('#routers tbody tr')].map(tr => tr.querySelector('td').textContent)]"""
DECISIONS_JS = """return [...document.querySelectorAll('#decisions tbody tr')].map(tr =>
  [...tr.querySelectorAll('td')].map(td => td.textContent))"""


def test_dashboard_in_a_real_browser(cluster, browser, tmp_path):  # noqa: F811
    browser.get(cluster + "/dashboard")
    rows = browser.wait_for(lambda: (w := browser.js(WORKERS_JS)) and len(w) == 3 and w, 30, "no workers shown")
    assert sorted(w["role"] for w in rows) == ["decode", "pre-prefill", "prefill"]
    assert {w["health"] for w in rows} == {"ok"}
    heads = browser.js(HEADERS_JS)
    assert heads[:4] == ["worker", "role", "health", "last heartbeat (s ago)"]
    assert {"queued_prefill_tokens", "running", "kv_usage", "prefill_tok_s", "l2_bytes_s", "l3_bytes_s"} <= set(heads)
    assert "url" not in heads and "pid" not in heads      # the browser holds no token: redacted
    assert browser.js(ROUTERS_JS) == ["one router", "router-0 (this one)"]   # its own URL withheld too
    before = browser.js(POINTS_JS)
    send_traffic(cluster)
    grown = browser.wait_for(lambda: (p := browser.js(POINTS_JS)) > before and p, 30, "TTFT chart got no points")
    browser.wait_for(lambda: browser.js(POINTS_JS) > grown, 30, "TTFT chart stopped gaining points")
    shown = browser.wait_for(lambda: (d := browser.js(DECISIONS_JS)) and len(d) == 4 and d, 30, "no decisions")
    state = httpx.get(cluster + "/v1/dashboard/state", timeout=10).json()
    want = [[d["cls"], str(d["turn"]), d["path"], d["decode"], d["reason"]] for d in state["decisions"]]
    assert [[r[1], r[2], r[3], r[5], r[13]] for r in shown] == want    # 13: reason (after the TPOT columns)
    assert all(r[13] for r in shown) and {r[2] for r in shown} == {"1", "2"}
    ids = {w["id"] for w in rows}
    assert all(r[5] in ids for r in shown)
    assert [r[8] != "–" for r in shown] == [True] * 4     # actual TTFT next to the predicted one
    adm = state["admission"]        # the limit in force and why, as /v1/cluster says it
    want_limit = f"limit {adm['max_in_flight']}: {adm['reason']}"   # traffic is over: it stays put
    browser.wait_for(lambda: browser.js(LIMIT_JS) == want_limit, 10, f"admission limit shown is not {want_limit!r}")
    png = browser.screenshot(tmp_path / "dashboard.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def exposed(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """Names a query may use (each family's names by its type) and the labels of each
    sample name seen."""
    names, labels = set(), {}
    for fam in text_string_to_metric_families(text):
        names |= {fam.name + s for s in SUFFIXES.get(fam.type, ("",))}
    for s in samples(text):
        names.add(s.name)
        labels.setdefault(s.name, set()).update(s.labels)
    return names, labels


def test_grafana_queries_use_only_live_metric_names(cluster):
    send_traffic(cluster)
    httpx.post(cluster + "/v1/completions", json={"prompt": "x", "max_tokens": -1}, timeout=10)   # a 4xx
    urls = [w["url"] for w in httpx.get(cluster + "/v1/cluster", headers=AUTH, timeout=10).json()["workers"]]
    names, labels = set(), {}
    for url in [cluster, *urls]:
        n, lab = exposed(httpx.get(url + "/metrics", timeout=10).text)
        names |= n
        for k, v in lab.items():
            labels.setdefault(k, set()).update(v)
    dash = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 30
    used = {m for e in exprs for m in re.findall(r"\bwarmpath_[a-z0-9_]+", e)}
    assert sorted(used - names) == []
    assert {"warmpath_router_ttft_seconds_bucket", "warmpath_time_to_first_token_seconds_bucket",
            "warmpath_kv_tier_loaded_tokens_total", "warmpath_router_prefix_tokens_total"} <= set(labels)
    for e in exprs:       # a "sum by (x)" groups by labels its metric has (where it has samples yet)
        for by in re.findall(r"by \(([^)]*)\)", e):
            want = {x.strip() for x in by.split(",")} - {"le", "instance"}
            for m in re.findall(r"\bwarmpath_[a-z0-9_]+", e):
                if m in labels:
                    assert want <= labels[m], (e, labels[m])

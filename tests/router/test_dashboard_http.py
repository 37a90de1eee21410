"""The dashboard's routes on a real router process with API keys: the page and its files are
public (they hold no data), ``/v1/dashboard/state`` follows the ``/v1/cluster`` key rule and
carries no URLs or PIDs."""

import time

import httpx

from tests.conftest import AUTH, serve_process

KEY = {"Authorization": "Bearer dash-key"}
NS = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}


def test_page_is_public_and_its_data_needs_the_api_key():
    with serve_process("--api-key", "dash-key", command="router") as router:
        reg = {"worker_id": "x", "role": "decode", "url": "http://127.0.0.1:1", "namespace": NS, "pid": 4242}
        assert httpx.post(router + "/internal/register", json=reg, headers=AUTH).status_code == 200
        page = httpx.get(router + "/dashboard")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        assert '<script src="/dashboard/static/dashboard.js"></script>' in page.text
        js = httpx.get(router + "/dashboard/static/dashboard.js")
        assert js.status_code == 200 and js.headers["content-type"] == "text/javascript; charset=utf-8"
        assert "/v1/dashboard/state" in js.text
        assert httpx.get(router + "/dashboard/static/dashboard.css").status_code == 200
        assert httpx.get(router + "/dashboard/static/..%2Fapp.py").status_code == 404
        assert httpx.get(router + "/dashboard/static/app.py").status_code == 404
        for headers in (None, AUTH, {"Authorization": "Bearer wrong"}):
            r = httpx.get(router + "/v1/dashboard/state", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.get(router + "/v1/dashboard/state", headers=KEY)
        assert r.status_code == 200
        state = r.json()
        assert state["workers"]["x"]["role"] == "decode" and state["workers"]["x"]["health"] == "ok"
        assert 0 <= state["workers"]["x"]["last_seen_s"] < 30
        assert state["decisions"] == [] and state["role_changes"] == []
        adm = state["admission"]
        assert {k: adm[k] for k in ("in_flight", "waiting", "rejected", "max_in_flight", "source")} == {
            "in_flight": 0, "waiting": 0, "rejected": 0, "max_in_flight": 64, "source": "fleet"}
        assert adm["reason"] == "sum of what each worker can hold (sequence limit, no request size seen yet): x 64"
        assert "4242" not in r.text and "127.0.0.1:1" not in r.text
        deadline = time.time() + 10          # the housekeeping loop samples once a second
        while len(samples := httpx.get(router + "/v1/dashboard/state", headers=KEY).json()["samples"]) < 2:
            assert time.time() < deadline, "no samples"
            time.sleep(0.3)
        assert 0.5 < samples[1]["t"] - samples[0]["t"] < 2
        assert samples[0]["in_flight"] == 0 and samples[0]["limit"] == 64 and samples[0]["classes"]["cold"]["n"] == 0

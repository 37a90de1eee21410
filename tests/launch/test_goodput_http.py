"""The goodput policy on real processes (router, a prefill and a decode worker, Mooncake) with
the real SmolLM2: the same greedy text as one engine, turn-1 requests taken locally by the
idle decode worker (no prefill hop, no handoff), and the predictions reported beside the
measurements (headers, /v1/cluster's decisions, the TPOT error histogram)."""

import json

import httpx
import openai

from tests.conftest import cluster_process, metric
from tests.launch.conftest import M, QUESTION, TURNS, check_streamed_and_text


def test_goodput_serves_the_same_text_with_turn1_requests_local(tmp_path, reference):
    topo = tmp_path / "goodput-1p1d.json"
    topo.write_text(json.dumps({"policy": "goodput", "workers": {"prefill": 1, "decode": 1}}))
    with cluster_process(str(topo), "--slo", "warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=5") as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        r = c.chat.completions.with_raw_response.create(model=M, messages=QUESTION, temperature=0, max_tokens=16)
        assert r.parse().choices[0].message.content == reference["chat"]
        h = r.headers
        # turn 1 on the idle decode worker: no handoff beats the prefill worker's hop and write-through
        assert (h["x-warmpath-route"], h["x-warmpath-worker"]) == ("local", "decode-0")
        assert float(h["x-warmpath-predicted-ttft-s"]) > 0 and float(h["x-warmpath-predicted-tpot-s"]) > 0
        check_streamed_and_text(c, reference)
        msgs, paths = [], []
        for i, q in enumerate(TURNS):
            msgs.append({"role": "user", "content": q})
            resp = httpx.post(base + "/v1/chat/completions", timeout=120, headers={"X-Session-Id": "conv"},
                              json={"model": M, "messages": msgs, "temperature": 0, "max_tokens": 20})
            assert resp.status_code == 200, resp.text
            a = resp.json()["choices"][0]["message"]["content"]
            assert a == reference["turns"][i], f"turn {i + 1}"
            paths.append(resp.headers["x-warmpath-route"])
            msgs.append({"role": "assistant", "content": a})
        assert set(paths) <= {"local", "warm", "cold"}
        info = httpx.get(base + "/v1/cluster", timeout=5).json()
        assert info["policy"] == "goodput"
        rows = info["decisions"]
        assert len(rows) == 6 and all(d["path"] in ("local", "warm", "cold") for d in rows)
        local1 = [d for d in rows if d["turn"] == 1 and d["path"] == "local"]
        why = [(d["turn"], d["path"], d["reason"]) for d in rows]
        assert len(local1) >= 3 and all(d["prefill"] is None and d["decode"] == "decode-0" for d in local1), why
        assert all(d["est_tpot_s"] > 0 and d["tpot_s"] > 0 for d in rows)   # predicted beside measured
        # every request with 2+ tokens fed the TPOT error histogram and the decode worker's correction
        assert metric(base, "warmpath_router_tpot_error_ratio_count") == 6
        assert info["model"]["tpot_error_n"] == 6 and set(info["model"]["tpot_scale"]) == {"decode-0"}


def test_a_replica_decodes_what_the_cold_tier_hands_it(tmp_path, reference):
    """A cold tier beside a replica, local paths off: every prompt is computed on the
    pre-prefill worker and handed through the store to the replica, which decodes it — the
    same greedy text as one engine, follow-ups included."""
    topo = tmp_path / "cold-beside-replica.json"
    topo.write_text(json.dumps({"policy": "goodput", "workers": {"pre-prefill": 1, "replica": 1}}))
    with cluster_process(str(topo), "--slo", "ttft_p90=30,tpot_p90=5", "--goodput-local", "off") as base:
        msgs = []
        for i, q in enumerate(TURNS):
            msgs.append({"role": "user", "content": q})
            resp = httpx.post(base + "/v1/chat/completions", timeout=120, headers={"X-Session-Id": "conv"},
                              json={"model": M, "messages": msgs, "temperature": 0, "max_tokens": 20})
            assert resp.status_code == 200, resp.text
            a = resp.json()["choices"][0]["message"]["content"]
            assert a == reference["turns"][i], f"turn {i + 1}"
            assert (resp.headers["x-warmpath-route"], resp.headers["x-warmpath-decode"]) == ("cold", "replica-0")
            msgs.append({"role": "assistant", "content": a})
        rows = httpx.get(base + "/v1/cluster", timeout=5).json()["decisions"]
        assert [(d["prefill"], d["decode"]) for d in rows] == [("pre-prefill-0", "replica-0")] * len(TURNS)
        assert all(d["tpot_s"] > 0 for d in rows)     # the replica decoded every answer

"""Every topology, started by the real launcher (Mooncake, router, workers as processes),
gives the text of one engine for the same greedy requests; PPD x=1 keeps turns 2+ local."""

import httpx
import openai
import pytest

from tests.conftest import cluster_process
from tests.launch.conftest import M, QUESTION, TEXT, TURNS


def cluster(base):
    return httpx.get(base + "/v1/cluster", timeout=5).json()


def routed(base, role):
    return sum(w["routed"] for w in cluster(base)["workers"] if w["role"] == role)


@pytest.mark.parametrize("topology, ppd", [
    ("replica", None), ("pd-2p1d", None), ("pd-2p2d", None), ("cpd-1d", None), ("cpd-2d", None),
    ("ppd-1p3d", None), ("ppd-2p2d", "x0"), ("ppd-3p1d", "x1")])
def test_same_text_in_every_topology(topology, ppd, reference):
    args = ("--ppd", ppd) if ppd else ()
    with cluster_process(topology, *args) as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        r = c.chat.completions.create(model=M, messages=QUESTION, temperature=0, max_tokens=16)
        assert r.choices[0].message.content == reference["chat"]
        s = c.chat.completions.create(model=M, messages=QUESTION, temperature=0, max_tokens=16, stream=True)
        assert "".join(x.choices[0].delta.content or "" for x in s if x.choices) == reference["chat"]
        t = c.completions.create(model=M, prompt=TEXT, temperature=0, max_tokens=12)
        assert t.choices[0].text == reference["text"]
        with httpx.stream("POST", base + "/v1/completions", timeout=120,
                          json={"model": M, "prompt": TEXT, "max_tokens": 2, "stream": True}) as st:
            assert st.status_code == 200
            stages = [x.split(";")[0] for x in st.headers["server-timing"].split(", ")]
            assert stages[0] == "route" and stages[-1] == "decode_first", stages
            st.read()
        msgs, routes, stages, prefill_after_turn1, kv_after_turn1, ppd_after_turn1 = [], [], [], None, None, None
        for i, q in enumerate(TURNS):
            msgs.append({"role": "user", "content": q})
            resp = httpx.post(base + "/v1/chat/completions", timeout=120, headers={"X-Session-Id": "conv"},
                              json={"model": M, "messages": msgs, "temperature": 0, "max_tokens": 20})
            assert resp.status_code == 200, resp.text
            a = resp.json()["choices"][0]["message"]["content"]
            assert a == reference["turns"][i], f"turn {i + 1}"
            routes.append(resp.headers["x-warmpath-route"])
            stages.append(resp.json()["usage"]["warmpath"])   # what each worker measured itself
            timing = dict(x.split(";dur=") for x in resp.headers["server-timing"].split(", "))
            split = routes[-1] not in ("local", "replica")
            assert list(timing) == (["route", "prefill", "prefill_worker", "prefill_queue", "prefill_l3_get",
                                     "prefill_l3_put", "decode"] if split else ["route", "decode"])
            if split:  # the worker's own time is part of the router's round trip to it
                assert 0 < float(timing["prefill_worker"]) <= float(timing["prefill"])
            msgs.append({"role": "assistant", "content": a})
            if i == 0:
                prefill_after_turn1 = routed(base, "prefill") + routed(base, "pre-prefill")
                kv_after_turn1 = cluster(base)["kv_handoff_bytes"]
                ppd_after_turn1 = cluster(base)["ppd_decisions"]
        info = cluster(base)
        assert info["sessions"] >= 1
        if ppd == "x1":
            # turns 2 and 3 ran their append-prefill on the session's decode worker: no
            # prefill worker touched, no KV moved
            assert routes == ["pd", "local", "local"]
            assert routed(base, "prefill") == prefill_after_turn1
            assert info["kv_handoff_bytes"] == kv_after_turn1
            assert info["ppd_decisions"]["local"] - ppd_after_turn1["local"] == 2
            assert info["ppd_decisions"]["remote"] == ppd_after_turn1["remote"]
            for st in stages[1:]:   # the decode worker found the history in its own L1
                assert set(st) == {"worker"} and st["worker"]["loaded_tokens"]["L3"] == 0
                assert st["worker"]["loaded_tokens"]["L1"] > 0
        elif ppd == "x0":
            assert routes == ["pd", "pd", "pd"]
            assert info["ppd_decisions"]["remote"] - ppd_after_turn1["remote"] == 2
            assert info["ppd_decisions"]["local"] == 0
            for st in stages[1:]:   # the decode worker loaded the prompt the prefill worker stored
                assert st["decode"]["loaded_tokens"]["L3"] > 0, st
        if topology == "replica":
            assert set(routes) == {"replica"} and info["kv_handoff_bytes"] == 0

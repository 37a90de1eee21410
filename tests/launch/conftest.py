"""Fixtures of the tests that start whole clusters: the greedy answers one engine gives for
the requests they send, computed once for every module that compares against them."""

import pytest

from tests.conftest import served_params

M = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TEXT = "The three tiers of a KV cache hierarchy are"
TURNS = ["Tell me about the history of Rome in two sentences.", "And then?", "Why?"]


@pytest.fixture(scope="session")
def reference(served_model):
    """Greedy answers of a single engine (with the workers' other defaults: SmolLM2's
    repetition penalty): the question, the text prompt, a 3-turn chat."""
    from warmpath.engine.llm_engine import EngineConfig, LLMEngine

    e = LLMEngine(EngineConfig(), loaded=served_model)
    tok = e.tokenizer

    def run(ids, n):
        return tok.decode(e.generate([ids], served_params(served_model, n, temperature=0))[0],
                          skip_special=True)

    ref = {"chat": run(tok.encode(tok.apply_chat_template(QUESTION), add_special=False), 16),
           "text": run(tok.encode(TEXT), 12), "turns": []}
    msgs = []
    for q in TURNS:
        msgs.append({"role": "user", "content": q})
        a = run(tok.encode(tok.apply_chat_template(msgs), add_special=False), 20)
        ref["turns"].append(a)
        msgs.append({"role": "assistant", "content": a})
    return ref


def check_streamed_and_text(c, reference) -> None:
    """The question streamed and the text prompt through the OpenAI client ``c``: the one
    engine's greedy answers."""
    s = c.chat.completions.create(model=M, messages=QUESTION, temperature=0, max_tokens=16, stream=True)
    assert "".join(x.choices[0].delta.content or "" for x in s if x.choices) == reference["chat"]
    t = c.completions.create(model=M, prompt=TEXT, temperature=0, max_tokens=12)
    assert t.choices[0].text == reference["text"]


def check_same_text(base, reference, ppd=None, replica=False):
    """The requests of ``test_same_text_in_every_topology`` against a running cluster at
    ``base`` (``ppd``: the ``--ppd`` mode it was started with; ``replica``: a replica
    topology): each answer is the one engine's, the Server-Timing stages say where it
    ran, and PPD x1 / x0 keep turns 2+ local / remote."""
    import httpx
    import openai

    def cluster():
        return httpx.get(base + "/v1/cluster", timeout=5).json()

    def routed(role):
        return sum(w["routed"] for w in cluster()["workers"] if w["role"] == role)

    c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    r = c.chat.completions.create(model=M, messages=QUESTION, temperature=0, max_tokens=16)
    assert r.choices[0].message.content == reference["chat"]
    check_streamed_and_text(c, reference)
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
            prefill_after_turn1 = routed("prefill") + routed("pre-prefill")
            kv_after_turn1 = cluster()["kv_handoff_bytes"]
            ppd_after_turn1 = cluster()["ppd_decisions"]
    info = cluster()
    assert info["sessions"] >= 1
    if ppd == "x1":
        # turns 2 and 3 ran their append-prefill on the session's decode worker: no
        # prefill worker touched, no KV moved
        assert routes == ["pd", "local", "local"]
        assert routed("prefill") == prefill_after_turn1
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
    if replica:
        assert set(routes) == {"replica"} and info["kv_handoff_bytes"] == 0

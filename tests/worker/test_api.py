"""The OpenAI API over real HTTP, served by a real `warmpath serve` process on SmolLM2."""

import time

import httpx
import openai
import pytest
from httpx_sse import connect_sse

from tests.conftest import AUTH, metric, serve_process
from warmpath.models.loader import load_tokenizer

MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server():
    with serve_process("--topology", "single", "--max-num-batched-tokens", "256") as base:
        yield base


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)


def test_models_and_health(client, server):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["SmolLM2-135M-Instruct"]
    assert httpx.get(server + "/health").json() == {"status": "ok"}


def test_chat_paris_and_usage(client):
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MSG, temperature=0)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == 37
    assert r.usage.total_tokens == 37 + r.usage.completion_tokens
    # Same prompt again: the system prompt + question blocks come from the prefix cache.
    r2 = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MSG, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens == 32
    assert r2.choices[0].message.content == r.choices[0].message.content


SMOLLM2_DEFAULTS = {"temperature": 0.2, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.1,
                    "max_tokens": 1024}


def test_the_readme_request_gets_the_model_defaults_and_a_short_finished_answer(server):
    """The README's curl body (no temperature, no max_tokens): SmolLM2-Instruct's table
    defaults apply (a seeded request equals one that sends them) and the answer ends."""
    entry = httpx.get(server + "/v1/models").json()["data"][0]
    assert {k: v for k, v in entry["generation_defaults"].items() if k != "sources"} == SMOLLM2_DEFAULTS
    assert entry["generation_defaults"]["sources"]["temperature"] == "model table"
    assert entry["generation_defaults"]["sources"]["max_tokens"] == "--default-max-tokens"
    readme = {"model": "SmolLM2-135M-Instruct", "messages": MSG}

    def answer(**kw) -> dict:
        r = httpx.post(server + "/v1/chat/completions", json={**readme, **kw}, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()
    # seeded (unseeded, about 1 answer in 40 still loops to max_tokens: README), each ends soon
    given = {k: SMOLLM2_DEFAULTS[k] for k in ("temperature", "top_p", "repetition_penalty")}
    for seed in (1, 2, 3):
        r = answer(seed=seed)
        assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] < 64, r
        assert answer(seed=seed, **given)["choices"][0]["message"] == r["choices"][0]["message"]
    # a request's own value wins: greedy is the argmax answer
    assert answer(temperature=0)["choices"][0]["message"]["content"] == "The capital of France is Paris."


def test_chat_stream_equals_non_stream(client):
    kw = dict(model="SmolLM2-135M-Instruct", messages=MSG, temperature=0, max_tokens=12)
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.prompt_tokens == 37 and chunks[-1].choices == []


def test_sse_ends_with_done(server):
    body = {"messages": MSG, "max_tokens": 3, "stream": True, "temperature": 0}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)


def test_completions_and_stop_string(client):
    kw = dict(model="SmolLM2-135M-Instruct", prompt="The capital of France is", temperature=0, max_tokens=20)
    full = client.completions.create(**kw).choices[0].text
    assert len(full) > 6
    stop = full[3:6]
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, stop=[stop], **kw))
    assert streamed == r.choices[0].text


def test_completions_with_token_ids(client):
    r = client.completions.create(model="SmolLM2-135M-Instruct", prompt=[504, 3575, 282, 4649, 314],
                                  max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 4
    assert r.choices[0].finish_reason == "length"


BAD = [
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": MSG, "model": "gpt-4"}, "model"),
    ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ({"messages": MSG, "max_tokens": "ten"}, "max_tokens"),
    ({"messages": MSG, "temperature": -0.5}, "temperature"),
    ({"messages": MSG, "top_p": 0}, "top_p"),
    ({"messages": MSG, "top_p": 1.01}, "top_p"),
    ({"messages": MSG, "n": 2}, "n"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": MSG, "stream": "yes"}, "stream"),
    ({"messages": MSG, "stop": 3}, "stop"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, "messages"),
    ({"messages": MSG, "max_tokens": 9000}, "max_tokens"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_input_is_400_naming_the_field(server, body, param):
    r = httpx.post(server + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert param.split("[")[0].split(".")[0] in err["message"] or param == "model" and "gpt-4" in err["message"]


def test_malformed_json_and_completions_prompt(server):
    r = httpx.post(server + "/v1/chat/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/completions", json={"prompt": ""}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(server + "/v1/completions", json={"prompt": [1, 99999999]}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MSG, top_p=2)


def test_bad_requests_do_not_disturb_running_stream(server, client):
    body = {"messages": MSG, "max_tokens": 40, "stream": True, "temperature": 0, "ignore_eos": True}
    ref = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MSG, temperature=0,
                                         max_tokens=40, extra_body={"ignore_eos": True}).choices[0].message.content
    text = ""
    with httpx.Client(timeout=60) as http, connect_sse(http, "POST", server + "/v1/chat/completions",
                                                       json=body) as es:
        for i, ev in enumerate(es.iter_sse()):
            if i == 1:
                for b, _ in BAD[:6]:
                    assert httpx.post(server + "/v1/chat/completions", json=b, timeout=30).status_code == 400
            if ev.data == "[DONE]":
                break
            d = ev.json()
            text += d["choices"][0]["delta"].get("content") or "" if d["choices"] else ""
    assert text == ref


def test_client_disconnect_aborts_request(server):
    aborted = metric(server, "warmpath_requests_total", finish_reason="abort", model="SmolLM2-135M-Instruct") or 0
    body = {"messages": MSG, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 6:
                break
    body["stream"] = False
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/v1/chat/completions", json=body, timeout=1.5)
    deadline = time.time() + 10
    while time.time() < deadline:
        now = metric(server, "warmpath_requests_total", finish_reason="abort", model="SmolLM2-135M-Instruct") or 0
        if now >= aborted + 2 and metric(server, "warmpath_num_requests_running") == 0:
            break
        time.sleep(0.2)
    assert now == aborted + 2
    assert metric(server, "warmpath_num_requests_running") == 0
    assert metric(server, "warmpath_kv_cache_usage_ratio") == 0


def test_metrics_exposed(server, client):
    client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MSG, max_tokens=3)
    text = httpx.get(server + "/metrics").text
    for name in ("warmpath_time_to_first_token_seconds_count", "warmpath_time_per_output_token_seconds_count",
                 "warmpath_queue_time_seconds_count", "warmpath_num_requests_running",
                 "warmpath_num_requests_waiting", "warmpath_kv_cache_usage_ratio", "warmpath_prefix_cache_hit_rate"):
        assert name in text
    assert metric(server, "warmpath_time_to_first_token_seconds_count") >= 1
    assert metric(server, "warmpath_engine_busy_seconds_total") > 0
    assert metric(server, "warmpath_engine_compile_seconds") == 0     # eager: --compile off


def test_internal_prefill_then_generate_continues_after_the_handed_off_token(server, client):
    """The worker side of the P→D handoff on one process: /internal/prefill gives the first
    token; /internal/generate with it reports it at once and continues to the same text."""
    ref = client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                    max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    prompt = load_tokenizer().encode("The capital of France is")
    req = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
    pre = httpx.post(server + "/internal/prefill", json={"prompt_token_ids": prompt, "request": req}, timeout=60,
                     headers=AUTH)
    assert pre.status_code == 200
    p = pre.json()
    assert p["prompt_tokens"] == len(prompt) and p["kv_blocks"] == p["kv_bytes"] == 0   # no L3: nothing written
    assert p["l3_get_s"] == p["l3_put_s"] == 0.0   # this server has no L3
    gen = httpx.post(server + "/internal/generate", timeout=60, headers=AUTH, json={
        "kind": "text", "prompt_token_ids": prompt, "request": req, "first_token": p["token"], "prefill": {"cached_tokens": 3}})
    body = gen.json()
    assert body["choices"][0]["text"] == ref.choices[0].text
    assert body["usage"]["completion_tokens"] == 8 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
    assert body["usage"]["warmpath"]["prefill"] == {"cached_tokens": 3}   # relayed, as the caller measured
    assert float(gen.headers["x-warmpath-ttft-s"]) >= 0


@pytest.mark.parametrize("path, body, param", [
    ("/internal/prefill", {"request": {}}, "prompt_token_ids"),
    ("/internal/prefill", {"prompt_token_ids": [1, 2], "request": 5}, "request"),
    ("/internal/generate", {"prompt_token_ids": [1, 2], "request": {}, "kind": "x"}, "kind"),
    ("/internal/generate", {"prompt_token_ids": [1, 2], "request": {}, "kind": "text", "first_token": "a"},
     "first_token"),
    ("/internal/generate", {"prompt_token_ids": [1, 2], "request": {}, "kind": "text", "first_token": 10**9},
     "first_token"),
])
def test_internal_endpoints_reject_bad_input(server, path, body, param):
    r = httpx.post(server + path, json=body, timeout=10, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    bad = httpx.post(server + path, content=b"{nope", timeout=10, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "body"

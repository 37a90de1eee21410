"""Checks that a peer router really routes (``benchmarks/peers/peers.py check``), and that
llama.cpp's ``llama-server`` behaves as ``benchmarks/peers/vs_llamacpp.py`` assumes.

* :func:`check_answers`: greedy 8-token answers through the peer equal a worker's own, for
  ``/v1/completions`` and ``/v1/chat/completions``, streamed and not.
* :func:`check_stickiness`: requests sharing a long prefix stay on one worker and reuse its
  KV (``usage.prompt_tokens_details.cached_tokens`` > 0). The serving worker of each request
  (sent one at a time) is the one whose ``warmpath_requests_total`` grew.
* :func:`check_llama_server`: token-id prompts, ``ignore_eos``, streamed usage, prompt
  caching on a repeat and none for a new prompt (``vs_llamacpp.py --check``).
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx

from warmpath.bench.prom import warmpath_totals
from warmpath.bench.workload import tokens

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHATS = [[{"role": "user", "content": "Say hi"}], [{"role": "user", "content": "What is 2+2?"}]]
# Three unrelated "repository contexts" (~600 characters each), each followed by short questions.
TOPICS = ["a Python web server that parses HTTP headers", "a Rust B-tree with copy-on-write pages",
          "a Go scheduler for batch jobs on a cluster"]
QUESTIONS = ["What does it do?", "List its modules.", "Where are the tests?"]


def model_of(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]


def ask(url: str, path: str, body: dict) -> tuple[str, dict]:
    """One request; returns (text, usage). Streams when ``body["stream"]``; the usage of a
    stream is its last chunk's (``stream_options.include_usage``)."""
    if not body.get("stream"):
        r = httpx.post(url + path, json=body, timeout=60)
        r.raise_for_status()
        d = r.json()
        c = d["choices"][0]
        return (c["text"] if "text" in c else c["message"]["content"]), d.get("usage") or {}
    parts, usage = [], {}
    body = {**body, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            usage = d.get("usage") or usage
            for c in d.get("choices") or []:
                parts.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return "".join(parts), usage


def check_answers(peer: str, worker: str) -> dict:
    """Every (endpoint, prompt, stream) answered through ``peer`` as ``worker`` answers it."""
    model = model_of(worker)
    cases = [("/v1/completions", {"prompt": p}) for p in PROMPTS] + \
            [("/v1/chat/completions", {"messages": m}) for m in CHATS]
    rows = []
    for path, extra in cases:
        for stream in (False, True):
            body = {"model": model, "max_tokens": 8, "temperature": 0, "stream": stream, **extra}
            direct, via = ask(worker, path, body)[0], ask(peer, path, body)[0]
            rows.append({"path": path, "stream": stream, "direct": direct, "peer": via, "equal": direct == via})
    return {"ok": all(r["equal"] for r in rows), "cases": rows}


def served_counts(workers: list[str]) -> list[float]:
    """Requests each worker has finished so far."""
    return [warmpath_totals(httpx.get(w + "/metrics", timeout=5).text).get("warmpath_requests_total", 0.0)
            for w in workers]


def context(topic: str) -> str:
    """A long shared prefix (~600 characters, ~130 tokens) about ``topic``."""
    lines = [f"File {i}: part {i} of {topic}; it handles case {i} and logs every step." for i in range(8)]
    return f"You are reviewing {topic}.\n" + "\n".join(lines) + "\nQuestion: "


def check_stickiness(peer: str, workers: list[str]) -> dict:
    """Each topic's first question is sent to the peer at once for all topics (so a load-aware
    tie-break can spread them), then its other questions one by one: every later question must
    go to one worker and reuse KV there (cached tokens > 0 is only possible on the worker that
    took an earlier request of the topic: no prefix is sent anywhere else)."""
    model = model_of(workers[0])

    def send(topic: str, q: str) -> dict:
        return ask(peer, "/v1/completions", {"model": model, "prompt": context(topic) + q,
                                             "max_tokens": 8, "temperature": 0})[1]

    with ThreadPoolExecutor(len(TOPICS)) as pool:
        list(pool.map(send, TOPICS, [QUESTIONS[0]] * len(TOPICS)))
    rows = []
    for topic in TOPICS:
        for q in QUESTIONS[1:]:
            before = served_counts(workers)
            usage = send(topic, q)
            grew = [i for i, (b, c) in enumerate(zip(before, served_counts(workers))) if c > b]
            rows.append({"topic": topic, "question": q, "worker": grew[0] if len(grew) == 1 else None,
                         "prompt_tokens": usage.get("prompt_tokens"),
                         "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)})
    per_topic = {t: [r["worker"] for r in rows if r["topic"] == t] for t in TOPICS}
    sticky = all(len(set(ws)) == 1 and ws[0] is not None for ws in per_topic.values())
    reused = all(r["cached_tokens"] > 0 for r in rows)
    used = sorted({ws[0] for ws in per_topic.values() if ws[0] is not None})
    return {"ok": sticky and reused, "sticky": sticky, "reused_kv": reused, "workers_used": used,
            "per_topic": per_topic, "requests": rows}


def check_llama_server(url: str, max_tokens: int = 16) -> dict:
    """What ``benchmarks/peers/vs_llamacpp.py`` assumes of llama.cpp's ``llama-server``: token-id
    prompts, ``ignore_eos`` (exactly ``max_tokens`` generated), usage in the stream, greedy
    answers that repeat, prompt caching (a repeated prompt reports cached tokens) and no
    cache hit for a prompt sharing no prefix (the micro prefill's cold prompts).

    NOTE: the cold answer and the cached ones may differ where two logits nearly tie (a
    199-token cached prefix + 1 token is not computed in the same batch shape as 200 tokens),
    so only the two cached answers (one streamed, one not) must be equal.
    """
    model = model_of(url)
    p1, p2 = (tokens(random.Random(f"llama-server-check-{i}"), 200) for i in range(2))

    def send(p: list[int], stream: bool) -> tuple[str, dict]:
        return ask(url, "/v1/completions", {"model": model, "prompt": p, "max_tokens": max_tokens,
                                            "temperature": 0, "ignore_eos": True, "stream": stream})

    cold, u1 = send(p1, True)
    cached, u2 = send(p1, False)
    cached_streamed, _ = send(p1, True)
    _, u3 = send(p2, True)
    hits = [(u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in (u1, u2, u3)]
    rows = {"usage_in_stream": bool(u1), "all_tokens": u1.get("completion_tokens") == max_tokens,
            "token_id_prompt": u1.get("prompt_tokens") == len(p1), "greedy_repeats": cached == cached_streamed,
            "repeat_cached": hits[1] > 0, "new_prompt_cold": hits[2] == 0}
    return {"ok": all(rows.values()), **rows, "cold_equals_cached": cold == cached, "cached_tokens": hits,
            "model": model}

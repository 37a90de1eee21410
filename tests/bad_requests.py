"""A battery of bad requests, each with the 4xx (and field) it must get, and a runner that
fires them while a normal greedy request runs beside them (used by the worker, router and
cluster tests)."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
from httpx_sse import connect_sse


CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MSG = [{"role": "user", "content": "Name three colours."}]
VOCAB = 49152   # SmolLM2


def chat(**over) -> dict:
    return {"messages": MSG, "max_tokens": 2, **over}


def text(**over) -> dict:
    return {"prompt": "Hello", "max_tokens": 2, **over}


class Chunked:
    """A JSON body of about ``size`` bytes sent chunked (no ``Content-Length``: the limit can
    only be found while reading), made afresh on every send."""

    def __init__(self, size: int, piece: int = 1 << 16) -> None:
        self.size, self.piece = size, piece

    def __iter__(self):
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(self.size // self.piece):
            yield b"a" * self.piece
        yield b'"}]}'


def nested(depth: int) -> bytes:
    return b'{"messages": ' + b"[" * depth + b"]" * depth + b"}"


# (name, method, path, httpx keyword arguments, expected status, expected param or None)
PUBLIC = [
    ("seed 2^80", "POST", CHAT, {"json": chat(seed=2**80, temperature=0.7)}, 400, "seed"),
    ("seed -2^64", "POST", CHAT, {"json": chat(seed=-(2**64))}, 400, "seed"),
    ("seed float", "POST", CHAT, {"json": chat(seed=1.5)}, 400, "seed"),
    ("max_tokens 2^64", "POST", CHAT, {"json": chat(max_tokens=2**64)}, 400, "max_tokens"),
    ("max_tokens 0", "POST", CHAT, {"json": chat(max_tokens=0)}, 400, "max_tokens"),
    ("max_tokens true", "POST", CHAT, {"json": chat(max_tokens=True)}, 400, "max_tokens"),
    ("max_tokens beyond context", "POST", CHAT, {"json": chat(max_tokens=10**6)}, 400, "max_tokens"),
    ("max_completion_tokens -1", "POST", CHAT, {"json": chat(max_completion_tokens=-1)}, 400,
     "max_completion_tokens"),
    ("top_k 2^63", "POST", CHAT, {"json": chat(top_k=2**63)}, 400, "top_k"),
    ("top_k -5", "POST", CHAT, {"json": chat(top_k=-5)}, 400, "top_k"),
    ("n 10^30", "POST", CHAT, {"json": chat(n=10**30)}, 400, "n"),
    ("n 2", "POST", CHAT, {"json": chat(n=2)}, 400, "n"),
    ("temperature 3", "POST", CHAT, {"json": chat(temperature=3)}, 400, "temperature"),
    ("temperature string", "POST", CHAT, {"json": chat(temperature="0.5")}, 400, "temperature"),
    ("temperature NaN", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "x"}], '
                                                  b'"temperature": NaN}'}, 400, "body"),
    ("top_p Infinity", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "x"}], '
                                                 b'"top_p": Infinity}'}, 400, "body"),
    ("top_p 1e999", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "x"}], '
                                              b'"top_p": 1e999}'}, 400, "body"),
    ("top_p 0", "POST", CHAT, {"json": chat(top_p=0)}, 400, "top_p"),
    ("min_p 1.5", "POST", CHAT, {"json": chat(min_p=1.5)}, 400, "min_p"),
    ("min_p -0.1", "POST", TEXT, {"json": text(min_p=-0.1)}, 400, "min_p"),
    ("min_p string", "POST", CHAT, {"json": chat(min_p="0.1")}, 400, "min_p"),
    ("repetition_penalty 0", "POST", CHAT, {"json": chat(repetition_penalty=0)}, 400, "repetition_penalty"),
    # found by the fuzzer: a denormal penalty divided the logits into inf and the sampler failed (500)
    ("repetition_penalty 5e-324", "POST", CHAT, {"json": chat(repetition_penalty=5e-324)}, 400, "repetition_penalty"),
    ("repetition_penalty -1", "POST", TEXT, {"json": text(repetition_penalty=-1)}, 400, "repetition_penalty"),
    ("repetition_penalty 11", "POST", CHAT, {"json": chat(repetition_penalty=11)}, 400, "repetition_penalty"),
    ("repetition_penalty 1e999", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "x"}], '
                                                           b'"repetition_penalty": 1e999}'}, 400, "body"),
    ("top_k float", "POST", CHAT, {"json": chat(top_k=2.5)}, 400, "top_k"),
    ("presence_penalty 5", "POST", CHAT, {"json": chat(presence_penalty=5)}, 400, "presence_penalty"),
    ("logprobs", "POST", CHAT, {"json": chat(logprobs=True)}, 400, "logprobs"),
    ("stream string", "POST", CHAT, {"json": chat(stream="yes")}, 400, "stream"),
    ("stream_options list", "POST", CHAT, {"json": chat(stream=True, stream_options=[1])}, 400, "stream_options"),
    ("10,000 stop strings", "POST", CHAT, {"json": chat(stop=["x"] * 10_000)}, 400, "stop"),
    ("empty stop string", "POST", CHAT, {"json": chat(stop=["a", ""])}, 400, "stop[1]"),
    ("stop_token_ids 10^12", "POST", CHAT, {"json": chat(stop_token_ids=[10**12])}, 400, "stop_token_ids[0]"),
    ("stop_token_ids = vocab", "POST", CHAT, {"json": chat(stop_token_ids=[VOCAB])}, 400, "stop_token_ids"),
    ("messages a string", "POST", CHAT, {"json": {"messages": "hi"}}, 400, "messages"),
    ("messages empty", "POST", CHAT, {"json": {"messages": []}}, 400, "messages"),
    ("messages missing", "POST", CHAT, {"json": {"max_tokens": 2}}, 400, "messages"),
    ("role bad", "POST", CHAT, {"json": {"messages": [{"role": "root", "content": "x"}]}}, 400,
     "messages[0].role"),
    ("content int", "POST", CHAT, {"json": {"messages": [{"role": "user", "content": 5}]}}, 400,
     "messages[0].content"),
    ("image part", "POST", CHAT, {"json": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}}, 400, "messages[0].content[0].type"),
    ("prompt id out of vocab", "POST", TEXT, {"json": text(prompt=[1, VOCAB])}, 400, "prompt"),
    ("prompt id 2^80", "POST", TEXT, {"json": text(prompt=[2**80])}, 400, "prompt[0]"),
    ("prompt id negative", "POST", TEXT, {"json": text(prompt=[-1])}, 400, "prompt[0]"),
    ("prompt batch", "POST", TEXT, {"json": text(prompt=["a", "b"])}, 400, "prompt"),
    ("prompt empty", "POST", TEXT, {"json": text(prompt="")}, 400, "prompt"),
    ("echo", "POST", TEXT, {"json": text(echo=True)}, 400, "echo"),
    ("nested 10,000", "POST", CHAT, {"content": nested(10_000)}, 400, "body"),
    ("nested 100 in an ignored field", "POST", CHAT,
     {"content": b'{"messages": [{"role": "user", "content": "x"}], "metadata": '
                 + b'{"a": ' * 100 + b"1" + b"}" * 100 + b"}"}, 400, "body"),
    ("invalid UTF-8", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'},
     400, "body"),
    ("not JSON", "POST", CHAT, {"content": b"hello"}, 400, "body"),
    ("truncated JSON", "POST", CHAT, {"content": b'{"messages": [{"role": "us'}, 400, "body"),
    ("JSON array", "POST", CHAT, {"json": [1, 2]}, 400, None),
    ("empty body", "POST", CHAT, {"content": b""}, 400, None),
    ("prompt of 9,000 token ids", "POST", TEXT, {"json": text(prompt=[7] * 9000)}, 400, "prompt"),
    ("prompt of 600K characters", "POST", TEXT, {"json": text(prompt="ab" * 300_000)}, 400, "prompt"),
    ("9 MiB body", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "'
                                            + b"a" * (9 << 20) + b'"}]}'}, 413, None),
    ("10 MB body", "POST", CHAT, {"content": b'{"messages": [{"role": "user", "content": "'
                                             + b"a" * 10_000_000 + b'"}]}'}, 413, None),
    ("10 MB chunked body (no Content-Length)", "POST", CHAT, {"content": Chunked(10_000_000)}, 413, None),
    ("unknown route", "POST", "/v1/nope", {"json": {}}, 404, None),
    ("wrong method", "GET", CHAT, {}, 405, None),
    ("DELETE models", "DELETE", "/v1/models", {}, 405, None),
    ("unknown model", "POST", CHAT, {"json": chat(model="gpt-9")}, 400, "model"),
]

# A worker's /internal/* routes (the router's messages), sent straight to a worker.
WORKER_INTERNAL = [
    ("prefill empty object", "POST", "/internal/prefill", {"json": {}}, 400, None),
    ("prefill id 2^80", "POST", "/internal/prefill",
     {"json": {"prompt_token_ids": [2**80], "request": {}}}, 400, "prompt_token_ids[0]"),
    ("prefill id out of vocab", "POST", "/internal/prefill",
     {"json": {"prompt_token_ids": [1, VOCAB], "request": {}}}, 400, "prompt_token_ids"),
    ("prefill seed 2^80", "POST", "/internal/prefill",
     {"json": {"prompt_token_ids": [1, 2], "request": {"seed": 2**80}}}, 400, "request.seed"),
    ("prefill min_p 2", "POST", "/internal/prefill",
     {"json": {"prompt_token_ids": [1, 2], "request": {"min_p": 2}}}, 400, "request.min_p"),
    ("generate repetition_penalty 0", "POST", "/internal/generate",
     {"json": {"kind": "text", "prompt_token_ids": [1, 2], "request": {"repetition_penalty": 0}}}, 400,
     "request.repetition_penalty"),
    ("prefill request a list", "POST", "/internal/prefill",
     {"json": {"prompt_token_ids": [1, 2], "request": []}}, 400, "request"),
    ("generate bad kind", "POST", "/internal/generate",
     {"json": {"kind": "image", "prompt_token_ids": [1, 2], "request": {}}}, 400, "kind"),
    ("generate first_token 10^9", "POST", "/internal/generate",
     {"json": {"kind": "text", "prompt_token_ids": [1, 2], "request": {}, "first_token": 10**9}}, 400,
     "first_token"),
    ("generate prefill.cached_tokens -1", "POST", "/internal/generate",
     {"json": {"kind": "text", "prompt_token_ids": [1, 2], "request": {}, "prefill": {"cached_tokens": -1}}},
     400, "prefill.cached_tokens"),
    ("generate nested", "POST", "/internal/generate", {"content": nested(5_000)}, 400, "body"),
    ("prefill GET", "GET", "/internal/prefill", {}, 405, None),
]

_NS = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}
# The router's /internal/* routes (the workers' messages), sent straight to a router.
ROUTER_INTERNAL = [
    ("register empty", "POST", "/internal/register", {"json": {}}, 400, None),
    ("register ftp url", "POST", "/internal/register", {"json": {
        "worker_id": "x", "role": "prefill", "url": "ftp://evil", "namespace": _NS}}, 400, "url"),
    ("register bad role", "POST", "/internal/register", {"json": {
        "worker_id": "x", "role": "boss", "url": "http://127.0.0.1:1", "namespace": _NS}}, 400, "role"),
    ("register block_size 0", "POST", "/internal/register", {"json": {
        "worker_id": "x", "role": "prefill", "url": "http://127.0.0.1:1",
        "namespace": {**_NS, "block_size": 0}}}, 400, "namespace.block_size"),
    ("heartbeat l3_bytes_s 0", "POST", "/internal/heartbeat",
     {"json": {"worker_id": "decode-0", "l3_bytes_s": 0}}, 400, "l3_bytes_s"),
    ("heartbeat kv_usage NaN", "POST", "/internal/heartbeat",
     {"content": b'{"worker_id": "decode-0", "kv_usage": NaN}'}, 400, "body"),
    ("heartbeat running -1", "POST", "/internal/heartbeat",
     {"json": {"worker_id": "decode-0", "running": -1}}, 400, "running"),
    ("heartbeat unknown field", "POST", "/internal/heartbeat",
     {"json": {"worker_id": "decode-0", "pid": 5}}, 400, "pid"),
    ("heartbeat unknown worker", "POST", "/internal/heartbeat", {"json": {"worker_id": "nobody"}}, 404,
     "worker_id"),
    ("drain bad action", "POST", "/internal/drain", {"json": {"worker_id": "decode-0", "action": "kill"}}, 400,
     "action"),
    ("drain unknown worker", "POST", "/internal/drain", {"json": {"worker_id": "nobody"}}, 404, "worker_id"),
]


def cluster_auth() -> dict:
    """The cluster token header of the processes tests.conftest starts."""
    from tests.conftest import AUTH

    return AUTH


def check(base: str, cases: list, auth: dict | None = None) -> list[str]:
    """Send every case with the cluster token ``auth`` (default: tests.conftest's; as the
    router and the workers do: a worker behind a router wants it on /v1/* too; a router
    without API keys ignores it); returns what went wrong (empty when every case got its 4xx)."""
    wrong, auth = [], auth if auth is not None else cluster_auth()
    with httpx.Client(timeout=60) as c:
        for name, method, path, kw, status, param in cases:
            try:
                r = c.request(method, base + path, **kw, headers=auth)
            except httpx.HTTPError as e:
                wrong.append(f"{name}: {type(e).__name__}: {e}")
                continue
            err = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") else None
            if r.status_code != status or not isinstance(err, dict) or not err.get("message"):
                wrong.append(f"{name}: got {r.status_code} {r.text[:200]!r}, want {status}")
            elif param is not None and err.get("param") != param:
                wrong.append(f"{name}: param {err.get('param')!r}, want {param!r} ({err['message']})")
    return wrong


def greedy_stream(base: str, max_tokens: int = 40) -> str:
    """A normal greedy streamed chat request; returns its text."""
    body = {"messages": MSG, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    out = []
    with httpx.Client(timeout=300) as http, connect_sse(http, "POST", base + CHAT, json=body) as es:
        assert es.response.status_code == 200, es.response.read()
        for ev in es.iter_sse():
            if ev.data == "[DONE]":
                break
            d = ev.json()
            assert "error" not in d, d
            out += [c["delta"].get("content") or "" for c in d["choices"]]
    return "".join(out)


def battery_beside_greedy(base: str, targets: list[tuple[str, list]]) -> tuple[list[str], str, str]:
    """Greedy text before, then the bad cases against each ``(url, cases)`` while the same
    greedy request runs; returns (what went wrong, text before, text beside)."""
    before = greedy_stream(base)
    with cf.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(greedy_stream, base)
        wrong = [w for url, cases in targets for w in check(url, cases)]
        return wrong, before, beside.result()

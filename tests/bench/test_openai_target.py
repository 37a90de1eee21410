"""OpenAITarget reading a streamed completion (httpx-sse over a mock transport, no server)."""

import asyncio
import json

import httpx

from warmpath.bench.runner import OpenAITarget

SSE = {"content-type": "text/event-stream; charset=utf-8"}


def event(d) -> str:
    return f"data: {json.dumps(d)}\n\n"


def text(t: str) -> str:
    return event({"choices": [{"index": 0, "text": t}]})


def complete(body: str, status: int = 200, headers=None):
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(status, headers=SSE if headers is None else headers, content=body.encode())

    t = OpenAITarget("http://bench.test/v1", model="m", timeout_s=5)
    t.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    ans = asyncio.run(t.complete([1, 2, 3], 4, "s0"))
    return ans, seen


def test_text_events_usage_and_done_end_the_stream():
    usage = {"prompt_tokens": 3, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}
    body = (": keep-alive comment\n\n" + event({"choices": [{"index": 0, "text": ""}]})
            + text("a") + text("b") + "data: {\"choices\": [{\"text\": \"c\"}]}\r\n\r\n"
            + event({"choices": [], "usage": usage}) + "data: [DONE]\n\n" + text("after done"))
    ans, seen = complete(body)
    assert ans.ok and ans.error is None
    assert ans.text == "abc"                   # the empty first event and text after [DONE] don't count
    assert (ans.output_tokens, ans.prompt_tokens, ans.cached_tokens) == (3, 3, 2)
    assert len(ans.itls) == 2                  # between a-b and b-c
    assert 0 <= ans.ttft <= ans.e2e
    req = json.loads(seen[0].content)
    assert seen[0].url == "http://bench.test/v1/completions"
    assert seen[0].headers["accept"] == "text/event-stream"
    assert (req["prompt"], req["max_tokens"], req["user"], req["stream"]) == ([1, 2, 3], 4, "s0", True)


def test_without_usage_counts_text_events_and_prompt_ids():
    ans, _ = complete(text("x") + text("y") + "data: [DONE]\n\n")
    # no usage: the cached tokens are unknown (None), not 0 (the classes fall back to prefix overlap)
    assert (ans.ok, ans.text, ans.output_tokens, ans.prompt_tokens, ans.cached_tokens) == (True, "xy", 2, 3, None)


def test_an_error_event_fails_the_request():
    err = {"error": {"message": "worker w1 failed mid-stream: ReadError", "code": "worker_failed"}}
    ans, _ = complete(text("a") + event(err) + "data: [DONE]\n\n")
    assert not ans.ok
    assert ans.error == "stream error: worker w1 failed mid-stream: ReadError"


def test_http_errors_and_a_non_sse_answer_fail_the_request():
    ans, _ = complete('{"error": {"message": "no"}}', status=429, headers={"content-type": "application/json"})
    assert (ans.ok, ans.error) == (False, "HTTP 429: b'{\"error\": {\"message\": \"no\"}}'")
    ans, _ = complete('{"choices": []}', headers={"content-type": "application/json"})
    assert not ans.ok and ans.error.startswith("SSEError: Expected response header Content-Type")


def server_metrics(status: int, body: str) -> dict:
    t = OpenAITarget("http://bench.test", model="m", timeout_s=5)
    t.http = httpx.AsyncClient(transport=httpx.MockTransport(lambda req: httpx.Response(status, text=body)))
    return asyncio.run(t.server_metrics())


def test_server_metrics_of_a_target_without_prometheus_metrics_is_empty():
    not_found = '{"error":{"type":"invalid_request_error","code":"unknown_url","message":"Invalid URL (GET /metrics)"}}'
    assert server_metrics(404, not_found) == {}          # smg's answer: 404 with a JSON body
    assert server_metrics(200, not_found) == {}          # 200 but not Prometheus text
    assert server_metrics(200, "warmpath_requests_total{model=\"m\"} 3.0\n") == {"warmpath_requests_total": 3.0}

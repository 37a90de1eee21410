"""The vLLM worker's pure parts: the completion body a GenerateRequest becomes, vLLM's stream
rendered as warmpath's chunks, its /metrics read, the server's command line."""

import pytest

from warmpath.models.generation import GenerationDefaults
from warmpath.protocol.errors import APIError
from warmpath.protocol.internal import GenerateRequest
from warmpath.vllm.load import RelayBook, parse_metrics
from warmpath.vllm.relay import Answer, completion_body, upstream_error
from warmpath.vllm.server import VLLMServerConfig

D = GenerationDefaults(temperature=0.2, top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.1, max_tokens=1024)


def gen(**request) -> GenerateRequest:
    return GenerateRequest.model_validate({"kind": "text", "prompt_token_ids": [1, 2, 3], "request": request})


def test_body_has_the_clients_fields_and_no_defaults_vllm_would_not_apply():
    # D has no sources: none of its values is the operator's or the model's (tests/vllm/test_greedy_body.py)
    body = completion_body(gen(max_tokens=8, temperature=0.0, seed=7, stop=["\n"]), "M", {"M"}, D, 100)
    assert body == {"model": "M", "prompt": [1, 2, 3], "max_tokens": 8, "stream": True,
                    "stream_options": {"include_usage": True}, "temperature": 0.0, "stop": ["\n"], "seed": 7}
    # left out: the context left caps the worker's default
    assert completion_body(gen(), "M", {"M"}, D, 10)["max_tokens"] == 7


@pytest.mark.parametrize("req,limit,param", [({"model": "other"}, 100, "model"), ({"max_tokens": 98}, 100, "max_tokens"),
                                             ({}, 3, "prompt_token_ids")])
def test_what_vllm_cannot_run_is_a_400_naming_the_field(req, limit, param):
    with pytest.raises(APIError) as e:
        completion_body(gen(**req), "M", {"M"}, D, limit)
    assert (e.value.status, e.value.param) == (400, param)
    handoff = GenerateRequest.model_validate({"kind": "text", "prompt_token_ids": [1], "request": {}, "first_token": 5})
    with pytest.raises(APIError) as e:
        completion_body(handoff, "M", {"M"}, D, 100)
    assert e.value.param == "first_token"


def test_vllm_stream_rendered_as_chat_chunks_and_usage():
    a = Answer("chat", "M", 3, rid="chatcmpl-x")
    assert a.chunk(None, None, first=True)["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
    out = a.feed({"choices": [{"index": 0, "text": "Hi", "finish_reason": None}]})
    out += a.feed({"choices": [{"index": 0, "text": "!", "finish_reason": "stop"}]})
    assert [c["choices"][0]["delta"] for c in out] == [{"content": "Hi"}, {"content": "!"}, {}]
    assert out[-1]["choices"][0]["finish_reason"] == "stop" and out[0]["object"] == "chat.completion.chunk"
    a.feed({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                     "prompt_tokens_details": {"cached_tokens": 2}}})
    u = a.usage_chunk()["usage"]
    assert u["warmpath"].pop("timing")["decode_steps"] == 1     # timings: test_answer_timings_...
    assert u == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                        "prompt_tokens_details": {"cached_tokens": 2},
                                        "warmpath": {"worker": {"loaded_tokens": {"L1": 2}, "recomputed_tokens": 1}}}
    whole = a.whole()
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hi!"} and whole["object"] == "chat.completion"
    t = Answer("text", "M", 3)
    t.feed({"choices": [{"text": "ab", "finish_reason": "length"}]})
    assert t.whole()["choices"][0] == {"index": 0, "text": "ab", "logprobs": None, "finish_reason": "length"}


def test_upstream_errors_keep_status_and_message():
    e = upstream_error(400, b'{"error": {"message": "bad prompt", "type": "BadRequestError", "code": 400}}')
    assert (e.status, e.message) == (400, "vLLM: bad prompt")
    assert upstream_error(500, b'{"object": "error", "message": "boom"}').message == "vLLM: boom"
    assert upstream_error(302, b"not json").status == 502


METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="M"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="M"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="M"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="M"} 5909.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="M"} 2816.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2912"} 1.0
"""


def test_metrics_and_heartbeat():
    m = parse_metrics(METRICS)
    assert (m.running, m.waiting, m.kv_usage, m.prefix_queries, m.prefix_hits, m.kv_tokens) == (
        3, 2, 0.25, 5909.0, 2816.0, 2912 * 16)
    assert parse_metrics("").kv_tokens is None
    book = RelayBook(prefill_tok_s=1000.0, alpha=0.5)
    book.started("a", 300)
    book.started("b", 200)
    book.first_token("a")
    book.finished("a", computed_tokens=300, ttft=0.1)     # 3000 tok/s measured
    hb = book.heartbeat("w", m)
    assert (hb.queued_prefill_tokens, hb.running, hb.kv_usage, hb.prefill_tok_s) == (200, 5, 0.25, 2000.0)


def test_server_command_line():
    c = VLLMServerConfig("/m", "M", 9000, "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", python="/py",
                         max_model_len=2048, threads_bind="0-1", kv_cache_gib=2, extra_args=("--enforce-eager",))
    assert c.argv() == ["/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--served-model-name", "M",
                        "--host", "127.0.0.1", "--port", "9000", "--enable-prefix-caching", "--block-size", "16",
                        "--max-num-seqs", "64", "--dtype", "auto", "--enable-prompt-tokens-details",
                        "--kv-events-config", '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":'
                        '"tcp://127.0.0.1:5557","replay_endpoint":"tcp://127.0.0.1:5558"}',
                        "--max-model-len", "2048", "--enforce-eager"]
    env = c.environ()
    assert (env["VLLM_CPU_KVCACHE_SPACE"], env["VLLM_CPU_OMP_THREADS_BIND"]) == ("2", "0-1")
    assert VLLMServerConfig("/m", "M", 1, "tcp://h:1", command=("docker", "run", "x")).launcher() == ["docker", "run", "x"]
    for bad in ({"kv_cache_gib": 0}, {"kv_cache_gib": 1.5}, {"port": 0}, {"python": "/p", "command": ("x",)}):
        with pytest.raises(ValueError):
            VLLMServerConfig(**{"model_dir": "/m", "served_model_name": "M", "port": 1,
                                "events_endpoint": "tcp://h:1", **bad})


def test_answer_timings_from_the_streamed_tokens():
    """First token 0.5 s after the start, the last 0.3 s after it over 2 more steps; 64 of the
    100 prompt tokens cached: the timings the router's cost model learns from."""
    ticks = iter([10.0, 10.5, 10.6, 10.8])
    a = Answer("text", "M", 100, clock=lambda: next(ticks))
    for text, reason in (("a", None), ("b", None), ("c", "length")):
        a.feed({"choices": [{"index": 0, "text": text, "finish_reason": reason}]})
    assert a.timing() is None          # vLLM's usage not yet in
    a.feed({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 3,
                                     "prompt_tokens_details": {"cached_tokens": 64}}})
    a.batch = 2.5
    want = {"computed_tokens": 36, "cached_tokens": 64, "prefill_s": 0.5, "queue_s": 0.0,
            "decode_s": 0.3, "decode_steps": 2, "batch": 2.5}
    assert a.timing() == pytest.approx(want)
    assert a.usage_chunk()["usage"]["warmpath"] == {
        "worker": {"loaded_tokens": {"L1": 64}, "recomputed_tokens": 36}, "timing": a.timing()}
    assert a.whole()["usage"]["warmpath"]["timing"] == a.timing()
    # one token only: no decode step
    one = Answer("text", "M", 10, clock=iter([0.0, 0.2]).__next__)
    one.feed({"choices": [{"text": "x", "finish_reason": "length"}]})
    one.feed({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
    assert one.timing() == {"computed_tokens": 10, "cached_tokens": 0, "prefill_s": 0.2, "queue_s": 0.0,
                            "decode_s": 0.0, "decode_steps": 0, "batch": 1.0}


def test_relay_book_batch_from_vllm_running_readings():
    book = RelayBook()
    book.started("a", 100)
    book.first_token("a")              # decoding alone (the relay's own count: 1)
    book.started("b", 50)
    book.first_token("b")              # beside a: 2
    assert book.finished("b") == 2.0   # no /metrics reading while it decoded: the relay's count
    book.heartbeat("w", parse_metrics("vllm:num_requests_running 3\n"))
    book.heartbeat("w", parse_metrics("vllm:num_requests_running 4\n"))
    assert book.finished("a") == 3.5   # the mean of vLLM's running requests read meanwhile
    assert book.finished("a") == 1.0 and book.decoding == {} and book.pending == {}
    book.started("c", 10)              # a reading of 0 running while c decodes counts c itself
    book.first_token("c")
    book.heartbeat("w", parse_metrics("vllm:num_requests_running 0\n"))
    assert book.finished("c") == 1.0


def test_a_vllm_worker_registers_the_prefill_chunk_vllm_runs():
    """The router chunks a prompt's predicted steps as vLLM will: ours when set, else one in
    --vllm-args, else vLLM's own default (2,048)."""
    base = ("/m", "M", 1, "tcp://h:1")
    assert VLLMServerConfig(*base).batched_tokens() == 2048
    assert VLLMServerConfig(*base, max_num_batched_tokens=4096).batched_tokens() == 4096
    assert VLLMServerConfig(*base, extra_args=("--max-num-batched-tokens", "8192")).batched_tokens() == 8192
    assert VLLMServerConfig(*base, extra_args=("--max-num-batched-tokens=1024",)).batched_tokens() == 1024
    assert VLLMServerConfig(*base, extra_args=("--max-num-batched-tokens", "8k")).batched_tokens() == 2048
    assert VLLMServerConfig(*base, max_num_batched_tokens=4096,
                            extra_args=("--no-enable-chunked-prefill",)).batched_tokens() is None   # whole prompts

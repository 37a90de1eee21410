"""The request models: every field range-checked, errors naming the field (hand-worked)."""

import pytest
from pydantic import ValidationError

from warmpath.protocol.http import json_depth_ok, parse_json, validation_error
from warmpath.protocol.errors import APIError
from warmpath.protocol.internal import GenerateRequest, Heartbeat, Registration
from warmpath.protocol.openai import ChatCompletionRequest, CompletionRequest

MSG = [{"role": "user", "content": "hi"}]


def first_error(cls, body) -> APIError:
    with pytest.raises(ValidationError) as e:
        cls.model_validate(body)
    return validation_error(e.value.errors())


@pytest.mark.parametrize("extra,param", [
    ({"seed": 2**80}, "seed"), ({"seed": 2**63}, "seed"), ({"top_k": 2**31}, "top_k"),
    ({"max_tokens": 2**31}, "max_tokens"), ({"n": 3}, "n"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_p": 1.01}, "top_p"), ({"stream": 1}, "stream"),
    ({"stop": ["a"] * 17}, "stop"), ({"stop": ["ok", ""]}, "stop[1]"), ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user"}]}, "messages[0]"),
    ({"min_p": 1.01}, "min_p"), ({"min_p": -0.01}, "min_p"), ({"min_p": float("nan")}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": 10.5}, "repetition_penalty"),
    ({"repetition_penalty": 5e-324}, "repetition_penalty"), ({"repetition_penalty": 0.09}, "repetition_penalty"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"), ({"repetition_penalty": "1.1"}, "repetition_penalty"),
    ({"temperature": "0.2"}, "temperature"), ({"top_k": True}, "top_k"),
])
def test_each_bad_field_is_named(extra, param):
    err = first_error(ChatCompletionRequest, {"messages": MSG, **extra})
    assert err.status == 400 and err.param == param and err.message.startswith(f"'{param}': ")


def test_a_json_integer_beyond_64_bits_is_out_of_range():
    body = parse_json(b'{"messages": [{"role": "user", "content": "hi"}], "seed": 1208925819614629174706176}')
    assert first_error(ChatCompletionRequest, body).message == "'seed': integer out of range"
    assert first_error(ChatCompletionRequest, {"messages": MSG, "seed": 1.5}).message == (
        "'seed': Input should be a valid integer")
    # a float with an integer value in range (JSON 39214.0) is not "out of range": just not an integer
    assert first_error(ChatCompletionRequest, {"messages": MSG, "top_k": 39214.0}).message == (
        "'top_k': Input should be a valid integer")


def test_in_range_values_pass_and_normalise():
    r = ChatCompletionRequest.model_validate({
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": None}, {"role": "user", "content": "q"}],
        "seed": -(2**63), "top_k": -1, "stop": "x", "max_completion_tokens": 7, "max_tokens": 3,
        "temperature": 0, "tools": [{"ignored": True}]})
    assert r.flat_messages() == [{"role": "system", "content": "ab"}, {"role": "assistant", "content": ""},
                                 {"role": "user", "content": "q"}]
    assert r.max_new_tokens == 7 and r.max_tokens_field == "max_completion_tokens"
    neutral = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    assert r.sampling_kwargs(neutral) == dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0,
                                              seed=-(2**63), stop=("x",), stop_token_ids=(), ignore_eos=False)
    assert r.forwarded() == {"seed": -(2**63), "top_k": -1, "stop": "x", "max_completion_tokens": 7,
                             "max_tokens": 3, "temperature": 0.0}


def test_completion_prompt_forms():
    assert CompletionRequest.model_validate({"prompt": [[5, 6]]}).prompt == [5, 6]
    assert CompletionRequest.model_validate({"prompt": ["abc"]}).prompt == "abc"
    assert first_error(CompletionRequest, {"prompt": [1, -2]}).param == "prompt[1]"
    assert first_error(CompletionRequest, {"prompt": ["a", "b"]}).param == "prompt"
    assert first_error(CompletionRequest, {"prompt": "x", "suffix": "y"}).param == "suffix"


def test_internal_messages():
    assert first_error(Heartbeat, {"worker_id": "w", "l3_bytes_s": 0}).param == "l3_bytes_s"
    assert first_error(Heartbeat, {"worker_id": "w", "prefill_tok_s": float("inf")}).param == "prefill_tok_s"
    assert first_error(Heartbeat, {"worker_id": "a b"}).param == "worker_id"
    ns = {"model_id": "m", "revision": "r", "dtype": "float32", "block_size": 16}
    assert first_error(Registration, {"worker_id": "w", "role": "decode", "url": "file:///etc/passwd",
                                      "namespace": ns}).param == "url"
    assert first_error(GenerateRequest, {"kind": "text", "prompt_token_ids": [1], "request": {"seed": 2**64}}
                       ).param == "request.seed"
    reg = {"worker_id": "w", "role": "decode", "url": "http://127.0.0.1:1", "namespace": ns}
    good = {"temperature": 0.2, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
            "max_tokens": 1024, "sources": {"temperature": "model card"}}
    assert Registration.model_validate({**reg, "generation_defaults": good}).generation_defaults.top_p == 0.9
    assert first_error(Registration, {**reg, "generation_defaults": {**good, "top_p": 0}}
                       ).param == "generation_defaults.top_p"
    assert Heartbeat(worker_id="w", running=2).load() == {
        "queued_prefill_tokens": 0, "running": 2, "kv_usage": 0.0, "prefill_tok_s": 500.0,
        "l2_bytes_s": 4e9, "l3_bytes_s": 4e8}


def test_json_limits():
    assert json_depth_ok([[[]]], 3) and not json_depth_ok([[[[]]]], 3)
    assert json_depth_ok({"a": {"b": 1}}, 2) and not json_depth_ok({"a": {"b": {}}}, 2)
    for raw, needle in [(b"[" * 5000 + b"]" * 5000, "depth"), (b'{"a": NaN}', "malformed"),
                        (b'"\xff"', "malformed"), (b"[" * 70 + b"]" * 70, "deeper than 64")]:
        with pytest.raises(APIError) as e:
            parse_json(raw)
        assert e.value.status == 400 and needle in e.value.message
    assert parse_json(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}

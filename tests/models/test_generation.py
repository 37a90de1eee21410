"""Default sampling parameters: where each one comes from (hand-worked precedence), the
override flag's checks, HF generation_config.json and GGUF general.sampling.* reading."""

import json

import pytest

from warmpath.models import generation as gen
from warmpath.models.generation import (GenerationDefaults, parse_override, read_generation_config,
                                        resolve_defaults, table_entry)
from warmpath.protocol import openai
from warmpath.protocol.openai import ChatCompletionRequest

MSG = [{"role": "user", "content": "hi"}]


def test_each_field_comes_from_the_first_layer_that_sets_it():
    d = resolve_defaults(override={"temperature": 0.5},
                         model={"temperature": 0.7, "top_k": 20, "max_new_tokens": 300},
                         table={"temperature": 0.2, "top_p": 0.9, "top_k": 50},
                         default_max_tokens=1024, model_source="generation_config.json")
    assert d == GenerationDefaults(temperature=0.5, top_p=0.9, top_k=20, min_p=0.0, repetition_penalty=1.0,
                                   max_tokens=300)
    assert d.sources == {"temperature": "--override-generation-config", "top_p": "model table",
                         "top_k": "generation_config.json", "min_p": "neutral", "repetition_penalty": "neutral",
                         "max_tokens": "generation_config.json"}


def test_without_override_or_model_config_smollm2_gets_its_table_row_and_the_server_max_tokens():
    d = resolve_defaults({}, {}, table_entry("SmolLM2-135M-Instruct"), 1024, "GGUF general.sampling.*")
    assert d.to_json() == {"temperature": 0.2, "top_p": 0.9, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.1,
                           "max_tokens": 1024, "sources": {
                               "temperature": "model table", "top_p": "model table", "top_k": "neutral",
                               "min_p": "neutral", "repetition_penalty": "model table",
                               "max_tokens": "--default-max-tokens"}}
    assert d.describe() == ("temperature 0.2 (model table), top_p 0.9 (model table), top_k 0 (neutral), "
                            "min_p 0.0 (neutral), repetition_penalty 1.1 (model table), "
                            "max_tokens 1024 (--default-max-tokens)")


def test_the_table_matches_instruct_smollm2_names_only():
    row = {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1}
    assert table_entry("SmolLM2-135M-Instruct.Q4_1") == row and table_entry("smollm2-1.7b-instruct") == row
    assert table_entry("SmolLM2-135M") == {} and table_entry("tiny") == {}
    assert resolve_defaults({}, {}, table_entry("tiny"), 64).sampling() == gen.NEUTRAL


def test_a_request_value_wins_over_every_default():
    defaults = resolve_defaults({"temperature": 0.5, "min_p": 0.1}, {}, {"top_p": 0.9}, 1024).sampling()
    req = ChatCompletionRequest.model_validate({"messages": MSG, "temperature": 0, "top_k": -1,
                                                "repetition_penalty": 1.2})
    kw = req.sampling_kwargs(defaults)
    assert {k: kw[k] for k in gen.SAMPLING_KEYS} == {"temperature": 0, "top_p": 0.9, "top_k": 0, "min_p": 0.1,
                                                     "repetition_penalty": 1.2}
    # null is "not given", as a field left out
    req = ChatCompletionRequest.model_validate({"messages": MSG, "temperature": None, "top_p": 0.5})
    kw = req.sampling_kwargs(defaults)
    assert (kw["temperature"], kw["top_p"]) == (0.5, 0.5)
    # the router forwards only what the client set: the workers fill in their defaults
    assert req.forwarded() == {"temperature": None, "top_p": 0.5}


def test_override_flag_parsing():
    assert parse_override('{"temperature": 0.5, "top_k": -1, "max_new_tokens": 64}') == {
        "temperature": 0.5, "top_k": 0, "max_new_tokens": 64}
    for text, needle in [("{temperature: 1}", "not JSON"), ("[1]", "JSON object"),
                         ('{"temp": 1}', "unknown keys ['temp']"), ('{"temperature": 3}', "temperature must be in"),
                         ('{"top_p": 0}', "top_p must be in (0, 1]"), ('{"min_p": "0.1"}', "min_p must be a finite"),
                         ('{"repetition_penalty": 0}', "repetition_penalty must be in [0.1, 10]"),
                         ('{"top_k": 1.5}', "top_k must be an integer"), ('{"max_new_tokens": 0}', "max_new_tokens"),
                         ('{"temperature": true}', "temperature must be a finite")]:
        with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("[", r"\[")):
            parse_override(text)


def test_cli_refuses_a_bad_override(capsys):
    from warmpath.cli import main

    with pytest.raises(SystemExit) as e:
        main(["worker", "--router", "http://x:1", "--override-generation-config", '{"top_p": 2}'])
    assert e.value.code == 2 and "top_p must be in (0, 1], got 2" in capsys.readouterr().err


def test_hf_generation_config_keys_and_bad_values(tmp_path, caplog):
    assert read_generation_config(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": None,
        "repetition_penalty": 1.05, "max_new_tokens": 256, "min_p": 7}))
    # min_p 7 is out of range: left out, with a warning; the model still loads
    assert read_generation_config(tmp_path) == {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.05,
                                                "max_new_tokens": 256}
    assert "min_p must be in [0, 1], got 7; ignored" in caplog.text
    (tmp_path / "generation_config.json").write_text("{")
    assert read_generation_config(tmp_path) == {}


def test_gguf_general_sampling_keys_become_the_generation_config(tmp_path):
    from gguf import GGUFWriter

    from warmpath.models.gguf_loader import _generation_config, _open

    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_sampling_temp(0.2)
    w.add_sampling_top_k(40)
    w.add_sampling_min_p(0.05)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cfg = _generation_config(_open(path))
    assert cfg == {"bos_token_id": None, "eos_token_id": 2, "temperature": 0.2, "top_k": 40, "min_p": 0.05}
    (tmp_path / "generation_config.json").write_text(json.dumps(cfg))
    assert read_generation_config(tmp_path) == {"temperature": 0.2, "top_k": 40, "min_p": 0.05}


def test_the_api_and_the_defaults_share_their_bounds():
    assert (gen.MAX_TEMPERATURE, gen.MAX_REPETITION_PENALTY) == (openai.MAX_TEMPERATURE,
                                                                 openai.MAX_REPETITION_PENALTY)
    assert gen.MIN_REPETITION_PENALTY == openai.MIN_REPETITION_PENALTY == 0.1
    assert gen.SAMPLING_KEYS == openai.SAMPLING_DEFAULTED
    with pytest.raises(ValueError, match="repetition_penalty must be in"):
        GenerationDefaults(repetition_penalty=11.0)

"""Model shapes from config.json files (sim/model_profile.py), hand-counted."""

import json

import pytest

from warmpath.sim.model_profile import MODELS, bundled, from_config, model_profile

TINY = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 128, "intermediate_size": 4096, "vocab_size": 1000, "tie_word_embeddings": False}


def test_a_dense_config_is_counted_layer_by_layer():
    m = from_config(TINY, "tiny")
    # attention 2·1024·1024 (Q, O) + 2·1024·256 (K, V); MLP 3·1024·4096; embeddings and LM head 2·1000·1024
    assert m.attn_params == 2_621_440 and m.active_linear_params == 2 * (2_621_440 + 12_582_912)
    assert m.params == 30_408_704 + 2_048_000
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 128 * 2 and m.weight_bytes == 2 * 32_456_704
    assert m.linear_flops(10, 2) == 2 * 30_408_704 * 10 + 2 * 2 * 1_024_000    # the LM head once per sequence
    assert m.attention_flops([(4, 6)]) == 4 * 2 * 8 * 128 * 4 * 8
    fp8 = m.with_precision("fp8")
    assert fp8.weight_bytes == 30_408_704 + 2 * 2_048_000      # embeddings and LM head stay BF16
    assert fp8.kv_bytes_per_token == 2048 and m.with_precision(kv="fp8").kv_bytes_per_token == 1024
    tied = from_config({**TINY, "tie_word_embeddings": True}, "tied")
    assert tied.params == m.params - 1_024_000


def test_a_mixture_of_experts_reads_only_the_experts_it_routes_to():
    moe = from_config({**TINY, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512}, "moe")
    experts = 2 * 8 * 3 * 1024 * 512
    assert moe.expert_params == experts
    assert moe.active_linear_params == 2 * (2_621_440 + 2 * 3 * 1024 * 512 + 1024 * 8)
    assert moe.step_weight_bytes(1) == pytest.approx(moe.weight_bytes - 2 * experts * (1 - 0.25))
    assert moe.step_weight_bytes(10_000) == pytest.approx(moe.weight_bytes)


def test_bundled_models_match_their_published_sizes():
    assert set(bundled()) >= {"llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "mistral-7b", "mixtral-8x7b"}
    assert round(MODELS["llama-3.1-8b"].params / 1e9, 2) == 8.03 and MODELS["llama-3.1-8b"].kv_bytes_per_token == 131072
    assert round(MODELS["llama-3.1-70b"].params / 1e9, 1) == 70.6
    assert round(MODELS["mixtral-8x7b"].params / 1e9, 1) == 46.7
    assert round(MODELS["qwen3-30b-a3b"].params / 1e9, 1) == 30.5
    assert MODELS["smollm2-135m"].kv_bytes_per_token == 46080     # the CPU engine's float32 cache


def test_any_config_json_by_path_and_clear_errors(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps(TINY))
    assert model_profile(str(tmp_path / "mine")).name == "mine"
    assert model_profile(str(tmp_path / "mine" / "config.json")).params == 32_456_704
    with pytest.raises(ValueError, match="not a bundled model"):
        model_profile("no-such-model")
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="not a decoder config.json"):
        model_profile(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="precision"):
        MODELS["llama-3.1-8b"].with_precision("int3")

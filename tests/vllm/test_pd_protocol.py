"""vLLM's disaggregated protocol as the vLLM worker speaks it (warmpath/vllm/pd.py) and the KV
connector flags (warmpath/vllm/connector.py): hand-worked bodies, replies and configs."""

import json

import pytest

from warmpath.cli import build_parser
from warmpath.protocol.errors import APIError
from warmpath.protocol.internal import GenerateRequest, PrefillReply, TierTokens
from warmpath.vllm.connector import buffer_device, check_flags, connector_env, kv_transfer_config, wheels_dir
from warmpath.vllm.pd import decode_body, prefill_body, prefill_reply
from warmpath.vllm.worker import server_config

BODY = {"model": "M", "prompt": [1, 2, 3], "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "stop": [],
        "stop_token_ids": [], "ignore_eos": False}
# what vLLM 0.32's NIXL connector answers (pull_scheduler.request_finished), as its prefill server returns it
PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[4, 5]],
          "remote_engine_id": "e-1", "remote_request_id": "cmpl-1-0", "remote_host": "127.0.0.1",
          "remote_port": 5601, "tp_size": 1, "dcp_size": 1, "pp_size": 1, "remote_num_tokens": 40,
          "remote_blocks_expiry_time": None, "transfer_mode": "pull"}


def test_prefill_body_asks_one_token_unstreamed_for_a_remote_decode():
    assert prefill_body(BODY) == {
        "model": "M", "prompt": [1, 2, 3], "max_tokens": 1, "stream": False, "temperature": 0.0, "top_p": 1.0,
        "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "stop": [], "stop_token_ids": [], "ignore_eos": False,
        "return_token_ids": True,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                               "remote_block_ids": None, "remote_host": None, "remote_port": None}}
    assert BODY["max_tokens"] == 8 and BODY["stream"] is True          # the request's own body untouched


def test_decode_body_is_the_whole_request_with_the_prefill_params():
    assert decode_body(BODY, PARAMS) == {**BODY, "kv_transfer_params": PARAMS}
    with pytest.raises(APIError) as e:   # the prefill request's own params, not a prefill server's answer
        decode_body(BODY, prefill_body(BODY)["kv_transfer_params"])
    assert (e.value.status, e.value.param) == (400, "kv_transfer_params")


def test_prefill_reply_from_vllms_answer():
    answer = {"id": "cmpl-1", "object": "text_completion", "model": "M", "kv_transfer_params": PARAMS,
              "choices": [{"index": 0, "text": " Paris", "token_ids": [7042], "finish_reason": "length"}],
              "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41,
                        "prompt_tokens_details": {"cached_tokens": 32}}}
    assert prefill_reply(answer, 40, 0.25) == PrefillReply(
        token=7042, prompt_tokens=40, cached_tokens=32, queue_s=0.0, prefill_s=0.25, kv_blocks=0, kv_bytes=0,
        l3_get_s=0.0, l3_put_s=0.0, cached_by_tier=TierTokens(L1=32), kv_transfer_params=PARAMS)
    # the reply crosses the router as JSON, kv_transfer_params opaque
    assert PrefillReply.model_validate_json(prefill_reply(answer, 40, 0.25).model_dump_json()).kv_transfer_params == PARAMS
    for params in (None, {"do_remote_prefill": False}):
        with pytest.raises(APIError) as e:
            prefill_reply({**answer, "kv_transfer_params": params}, 40, 0.25)
        assert (e.value.status, e.value.code) == (502, "kv_transfer_failed")


def test_generate_request_carries_the_params():
    msg = GenerateRequest.model_validate({"kind": "text", "prompt_token_ids": [1], "request": {},
                                          "kv_transfer_params": PARAMS})
    assert msg.kv_transfer_params == PARAMS and msg.first_token is None


def test_kv_transfer_configs():
    assert kv_transfer_config("nixl", "prefill", "cpu") == {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                                            "kv_buffer_device": "cpu"}
    assert kv_transfer_config("nixl", "decode", "cuda")["kv_buffer_device"] == "cuda"
    assert kv_transfer_config("mooncake", "prefill", "cpu") == {
        "kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}
    assert kv_transfer_config("mooncake", "decode", "cpu")["kv_role"] == "kv_consumer"
    own = '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'
    assert kv_transfer_config(own, "decode", "cpu") == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    for spec, msg in (("lmcache", "one of"), ("{bad", "not valid JSON"), ('{"kv_role": "kv_both"}', "kv_connector")):
        with pytest.raises(ValueError, match=msg):
            kv_transfer_config(spec, "prefill", "cpu")
    with pytest.raises(ValueError, match="replica has no hand-off"):
        kv_transfer_config("mooncake", "replica", "cpu")


def test_roles_and_flags():
    for role in ("pre-prefill", "prefill", "decode"):
        with pytest.raises(ValueError, match=f"--role {role} needs a KV connector"):
            check_flags(role, None)
        check_flags(role, "nixl")
    check_flags("replica", None)
    with pytest.raises(ValueError, match="one of"):
        check_flags("decode", "nxl")
    assert (buffer_device("auto", cuda_present=True), buffer_device("auto", cuda_present=False)) == ("cuda", "cpu")
    assert buffer_device("cpu", cuda_present=True) == "cpu"
    with pytest.raises(ValueError):
        buffer_device("tpu")


def test_nixl_env_side_channel_and_wheels(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_PEERS_DIR", str(tmp_path))
    cfg = kv_transfer_config("nixl", "decode", "cpu")
    want = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.2", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601", "VLLM_HOST_IP": "10.0.0.2"}
    assert connector_env(cfg, "10.0.0.2", 5601) == want                    # no wheels installed here
    assert wheels_dir("nixl") == tmp_path / "vllm-connectors" / "nixl"
    wheels_dir("nixl").mkdir(parents=True)
    (wheels_dir("nixl") / ".done").touch()
    assert connector_env(cfg, "10.0.0.2", 5601) == {**want, "PYTHONPATH": str(tmp_path / "vllm-connectors" / "nixl")}
    assert connector_env({"kv_connector": "LMCacheConnectorV1"}, "h", 1) == {}


def test_server_config_of_a_decode_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_PEERS_DIR", str(tmp_path))
    a = build_parser().parse_args(["worker", "--engine", "vllm", "--router", "http://r:1", "--role", "decode",
                                   "--vllm-kv-connector", "nixl", "--vllm-kv-buffer-device", "cpu",
                                   "--vllm-args", "--enforce-eager --seed 3"])
    cfg = server_config(a, tmp_path, "M", "tcp://127.0.0.1:1", None, "127.0.0.1", 5601)
    assert cfg.extra_args == ("--kv-transfer-config",
                              '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}',
                              "--enforce-eager", "--seed", "3")
    assert json.loads(cfg.extra_args[1])["kv_role"] == "kv_both"
    assert (cfg.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], cfg.env["VLLM_NIXL_SIDE_CHANNEL_HOST"]) == ("5601", "127.0.0.1")
    a.vllm_kv_connector = None
    with pytest.raises(ValueError, match="needs a KV connector"):
        server_config(a, tmp_path, "M", "tcp://127.0.0.1:1", None)

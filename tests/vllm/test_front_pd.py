"""The vLLM worker's HTTP face for P/D (warmpath/vllm/app.py), in process over ASGI: the
hand-off routes refused without a KV connector, and the prefill route's failure when its vLLM
server is not there (a port nothing listens on: nothing stands in for vLLM)."""

import asyncio

import httpx

from warmpath.procs import free_port
from warmpath.vllm.app import FrontConfig, build_vllm_front
from warmpath.vllm.load import RelayBook

PARAMS = {"do_remote_prefill": True, "remote_engine_id": "e-1", "remote_block_ids": [[4]]}


def call(connector: bool, path: str, body: dict) -> httpx.Response:
    cfg = FrontConfig(vllm_url=f"http://127.0.0.1:{free_port()}", model="M", max_model_len=64, kv_connector=connector)
    app = build_vllm_front(cfg, lambda: True, dict, RelayBook(), dict)

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
            try:
                return await c.post(path, json=body)
            finally:
                await app.state.http.aclose()

    return asyncio.run(go())


def test_handoff_routes_need_a_connector():
    r = call(False, "/internal/prefill", {"prompt_token_ids": [1, 2, 3], "request": {}})
    assert r.status_code == 400 and "runs no KV connector" in r.json()["error"]["message"]
    r = call(False, "/internal/generate", {"kind": "text", "prompt_token_ids": [1, 2, 3], "request": {},
                                           "kv_transfer_params": PARAMS})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "kv_transfer_params")


def test_prefill_without_its_vllm_is_a_retryable_503():
    r = call(True, "/internal/prefill", {"prompt_token_ids": [1, 2, 3], "request": {"max_tokens": 4}})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_failed"
    r = call(True, "/internal/generate", {"kind": "text", "prompt_token_ids": [1, 2, 3], "request": {},
                                          "kv_transfer_params": {"do_remote_decode": True}})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "kv_transfer_params")   # not a prefill's answer

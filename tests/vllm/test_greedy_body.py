"""What a vLLM worker sends its vLLM server: the fields the client sent, plus only the defaults
vLLM started on the same model would apply itself (the operator's override, the model's own
``generation_config.json``), never warmpath's model table (SmolLM2's repetition penalty 1.1
turned vLLM's bfloat16 greedy answer to "What is the capital of France?" into its second choice,
"L'Étoile (The City) - Paris, France. …", issue 53). A stand-in vLLM server on loopback records
the exact body; the request goes in as the router forwards it (``SamplingFields.forwarded``)."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from warmpath.models.files import load_tokenizer, spec_dir
from warmpath.models.generation import GenerationDefaults, read_generation_config, resolve_defaults, table_entry
from warmpath.protocol.internal import GenerateRequest
from warmpath.protocol.openai import ChatCompletionRequest
from warmpath.vllm.app import FrontConfig, build_vllm_front
from warmpath.vllm.load import RelayBook
from warmpath.vllm.relay import VLLM_OWN, completion_body, vllm_defaults

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class StandInVLLM:
    """``POST /v1/completions``: records the JSON body, answers one streamed token and usage."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):   # noqa: N802 - http.server's name
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                events = [{"choices": [{"index": 0, "text": "Paris", "finish_reason": "stop"}]},
                          {"choices": [], "usage": {"prompt_tokens": 37, "completion_tokens": 1}}]
                data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "StandInVLLM":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def worker_defaults(override: dict | None = None) -> GenerationDefaults:
    """The defaults ``warmpath worker --engine vllm`` resolves for SmolLM2 (vllm/worker.py)."""
    return resolve_defaults(override or {}, read_generation_config(spec_dir("smollm2")), table_entry(MODEL), 1024)


def relayed(client_body: dict, defaults: GenerationDefaults) -> tuple[dict, dict]:
    """(the body the stand-in vLLM got, the worker's answer) for a chat request as the router
    forwards it to the vLLM worker's ``/internal/generate``."""
    tok = load_tokenizer()
    req = ChatCompletionRequest.model_validate(client_body)
    ids = tok.encode(tok.apply_chat_template(req.flat_messages()), add_special=False)   # the router's
    gen = GenerateRequest.model_validate({"kind": "chat", "prompt_token_ids": ids, "request": req.forwarded()})
    with StandInVLLM() as vllm:
        app = build_vllm_front(FrontConfig(vllm_url=vllm.url, model=MODEL, max_model_len=8192, defaults=defaults),
                               lambda: True, dict, RelayBook(), dict)

        async def go() -> dict:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
                try:
                    r = await c.post("/internal/generate", json=gen.model_dump(mode="json", exclude_unset=True))
                    return r.json()
                finally:
                    await app.state.http.aclose()

        answer = asyncio.run(go())
    assert len(vllm.bodies) == 1
    return vllm.bodies[0], answer


def test_a_greedy_request_reaches_vllm_as_the_client_sent_it():
    d = worker_defaults()
    assert (d.repetition_penalty, d.sources["repetition_penalty"]) == (1.1, "model table")   # what was sent before
    body, answer = relayed({"model": MODEL, "messages": QUESTION, "temperature": 0}, d)
    ids = load_tokenizer().encode(load_tokenizer().apply_chat_template(QUESTION), add_special=False)
    assert len(ids) == 37
    # exactly: the client's temperature, the worker's max_tokens (its --default-max-tokens, which the
    # router books), streamed with usage; no repetition_penalty / top_p / top_k / min_p / stop fields
    assert body == {"model": MODEL, "prompt": ids, "max_tokens": 1024, "stream": True,
                    "stream_options": {"include_usage": True}, "temperature": 0.0}
    assert answer["choices"][0]["message"]["content"] == "Paris"


def test_the_chat_prompt_is_the_token_ids_vllms_own_template_makes():
    """vLLM renders the chat template with transformers: the router's ids are the same."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(spec_dir("smollm2")))
    theirs = hf.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
    tok = load_tokenizer()
    assert tok.encode(tok.apply_chat_template(QUESTION), add_special=False) == theirs


def test_client_fields_are_forwarded_as_sent_and_win_over_every_default():
    d = worker_defaults({"temperature": 0.5, "top_k": 20})
    body, _ = relayed({"messages": QUESTION, "temperature": 0, "top_p": 0.8, "top_k": 0, "min_p": 0.05,
                       "repetition_penalty": 1.2, "seed": 3, "stop": "\n", "stop_token_ids": [7],
                       "ignore_eos": True, "max_tokens": 5, "cache_salt": "s"}, d)
    body.pop("prompt")
    assert body == {"model": MODEL, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
                    "temperature": 0.0, "top_p": 0.8, "top_k": -1, "min_p": 0.05, "repetition_penalty": 1.2,
                    "stop": ["\n"], "stop_token_ids": [7], "ignore_eos": True, "seed": 3, "cache_salt": "s"}


def test_the_operators_override_and_the_models_config_are_sent_the_model_table_is_not():
    """``--override-generation-config`` and ``generation_config.json`` values are what vLLM on
    the same model applies too (sent explicitly); the model table's and neutral ones are not."""
    d = resolve_defaults({"top_k": 40}, {"temperature": 0.6, "max_new_tokens": 64},
                         {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1}, 1024)
    req = GenerateRequest.model_validate({"kind": "text", "prompt_token_ids": [1, 2, 3], "request": {"seed": 1}})
    assert completion_body(req, "M", {"M"}, d, 100) == {
        "model": "M", "prompt": [1, 2, 3], "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.6, "top_k": 40, "seed": 1}
    e = vllm_defaults(d)
    assert e.sampling() == {"temperature": 0.6, "top_p": 1.0, "top_k": 40, "min_p": 0.0, "repetition_penalty": 1.0}
    assert e.sources == {"temperature": "generation_config.json", "top_p": VLLM_OWN, "top_k": "--override-generation-config",
                         "min_p": VLLM_OWN, "repetition_penalty": VLLM_OWN, "max_tokens": "generation_config.json"}


def test_the_workers_models_page_shows_vllms_defaults():
    app = build_vllm_front(FrontConfig(vllm_url="http://127.0.0.1:9", model=MODEL, max_model_len=64,
                                       defaults=worker_defaults()), lambda: True, dict, RelayBook(), dict)

    async def go() -> dict:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
            try:
                return (await c.get("/v1/models")).json()
            finally:
                await app.state.http.aclose()

    shown = asyncio.run(go())["data"][0]["generation_defaults"]
    assert {k: shown[k] for k in ("temperature", "top_p", "repetition_penalty", "max_tokens")} == {
        "temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0, "max_tokens": 1024}
    assert shown["sources"]["repetition_penalty"] == VLLM_OWN

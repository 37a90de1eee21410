"""OpenAI-compatible HTTP API of one worker (FastAPI)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from warmpath.engine.async_engine import AsyncEngine, RequestHandle
from warmpath.engine.llm_engine import LLMEngine, RequestOutput
from warmpath.models.tokenizer import ChatTemplateError
from warmpath.server.metrics import EngineMetrics
from warmpath.server.protocol import (APIError, ParsedRequest, bad, make_params, parse_common,
                                      parse_messages, parse_prompt)


@dataclass(frozen=True)
class ServerConfig:
    """HTTP front settings."""

    host: str = "127.0.0.1"
    port: int = 8000
    default_max_tokens: int = 1024
    disconnect_poll_s: float = 0.25
    registration: object | None = None   # worker.registration.RegistrationConfig when behind a router

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.default_max_tokens <= 0:
            raise ValueError(f"default_max_tokens must be > 0, got {self.default_max_tokens}")


@dataclass
class _Job:
    rid: str
    kind: str                # "chat" | "text"
    handle: RequestHandle
    parsed: ParsedRequest
    prompt_tokens: int
    start: float
    cached_tokens: int | None = None  # reported by the prefill worker of a handoff


def build_app(engine: LLMEngine, cfg: ServerConfig = ServerConfig()) -> FastAPI:
    """Create the app; the engine thread starts and stops with the app's lifespan."""
    model_name = engine.loaded.model_id
    aliases = {model_name, engine.cfg.model}
    metrics = EngineMetrics(engine, model_name)
    aengine = AsyncEngine(engine, on_step=metrics.on_step)
    tok = engine.tokenizer

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        aengine.start()
        task = None
        if cfg.registration is not None:
            from warmpath.worker.registration import register_and_heartbeat

            task = asyncio.create_task(register_and_heartbeat(cfg.registration, engine))
        yield
        if task is not None:
            task.cancel()
        aengine.shutdown()

    app = FastAPI(title="warmpath", lifespan=lifespan)
    app.state.engine, app.state.aengine, app.state.metrics = engine, aengine, metrics

    @app.exception_handler(APIError)
    async def _api_error(_req: Request, e: APIError) -> JSONResponse:
        if 400 <= e.status < 500:
            metrics.rejected.labels(model_name).inc()
        return JSONResponse(e.body(), status_code=e.status)

    async def _body(req: Request) -> Any:
        raw = await req.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad("body", f"malformed JSON body: {e}") from e

    def _admit(parsed: ParsedRequest, prompt: list[int], kind: str, param: str,
               output_prefix: list[int] | None = None, run_tokens: int | None = None) -> _Job:
        if parsed.model is not None and parsed.model not in aliases:
            raise APIError(400, f"model {parsed.model!r} does not exist; available: {model_name!r}",
                           param="model", code="model_not_found")
        if not aengine.alive:
            raise APIError(503, "engine is not running", err_type="server_error")
        room = engine.max_model_len - len(prompt)
        max_tokens = parsed.max_tokens or max(1, min(cfg.default_max_tokens, room))
        try:
            engine.check_prompt(len(prompt), max_tokens)
        except ValueError as e:
            field = param if parsed.max_tokens is None or room <= 0 else "max_tokens"
            raise bad(field, f"{field}: {e}") from e
        if any(t < 0 or t >= engine.loaded.config.vocab_size for t in prompt):
            raise bad(param, f"token ids must be in [0, {engine.loaded.config.vocab_size})")
        params = make_params(parsed, run_tokens or max_tokens)
        if output_prefix and any(not 0 <= t < engine.loaded.config.vocab_size for t in output_prefix):
            raise bad("first_token", "token ids must be in the vocabulary")
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        handle = aengine.add_request(rid, prompt, params, parsed.cache_salt, output_prefix)
        return _Job(rid, kind, handle, parsed, len(prompt), time.monotonic())

    @app.post("/v1/chat/completions")
    async def chat(req: Request) -> Response:
        body = await _body(req)
        parsed = parse_common(body)
        msgs = parse_messages(body)
        if tok is None:
            raise bad("messages", "this model has no tokenizer; send token ids to /v1/completions")
        try:
            text = tok.apply_chat_template(msgs, add_generation_prompt=True)
        except ChatTemplateError as e:
            raise bad("messages", str(e)) from e
        job = _admit(parsed, tok.encode(text, add_special=False), "chat", "messages")
        return await _respond(req, job)

    @app.post("/v1/completions")
    async def completions(req: Request) -> Response:
        body = await _body(req)
        parsed = parse_common(body)
        if body.get("echo") or body.get("suffix"):
            raise bad("echo" if body.get("echo") else "suffix", "echo and suffix are not supported")
        prompt = parse_prompt(body)
        if isinstance(prompt, str):
            if tok is None:
                raise bad("prompt", "this model has no tokenizer; send token ids")
            prompt = tok.encode(prompt)
        job = _admit(parsed, prompt, "text", "prompt")
        return await _respond(req, job)

    def _usage(job: _Job, o: RequestOutput | None) -> dict:
        done = o.completion_tokens if o else 0
        return {"prompt_tokens": job.prompt_tokens, "completion_tokens": done,
                "total_tokens": job.prompt_tokens + done,
                "prompt_tokens_details": {"cached_tokens": job.cached_tokens if job.cached_tokens
                                          is not None else (o.cached_tokens if o else 0)}}

    def _chunk(job: _Job, text: str | None, reason: str | None, first: bool = False) -> dict:
        if job.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return {"id": job.rid, "object": obj, "created": int(time.time()), "model": model_name,
                "choices": [choice]}

    def _finish(job: _Job, ttft: float | None, last: RequestOutput | None, reason: str) -> None:
        metrics.on_finish(ttft, time.monotonic() - job.start, job.prompt_tokens,
                          last.completion_tokens if last else 0, reason)

    async def _respond(req: Request, job: _Job) -> Response:
        if job.parsed.stream:
            return StreamingResponse(_stream(job), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        texts, last, ttft, first_queue = [], None, None, 0.0
        next_check = time.monotonic() + cfg.disconnect_poll_s
        try:
            while True:
                try:
                    item = await asyncio.wait_for(job.handle.queue.get(), cfg.disconnect_poll_s)
                except asyncio.TimeoutError:
                    item = None
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + cfg.disconnect_poll_s
                    if await req.is_disconnected():
                        aengine.abort(job.rid)
                        _finish(job, ttft, last, "abort")
                        return Response(status_code=499)
                if item is None:
                    continue
                if isinstance(item, Exception):
                    raise _engine_error(item)
                if ttft is None:
                    ttft, first_queue = time.monotonic() - job.start, item.queue_time or 0.0
                texts.append(item.text)
                last = item
                if item.finished:
                    break
        except asyncio.CancelledError:
            aengine.abort(job.rid)
            raise
        _finish(job, ttft, last, last.finish_reason or "stop")
        text = "".join(texts)
        timing = {"X-Warmpath-Ttft-S": f"{ttft:.6f}", "X-Warmpath-Queue-S": f"{first_queue:.6f}"}
        if job.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": last.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}
            obj = "text_completion"
        return JSONResponse({"id": job.rid, "object": obj, "created": int(time.time()),
                             "model": model_name, "choices": [choice], "usage": _usage(job, last)},
                            headers=timing)

    async def _stream(job: _Job) -> AsyncIterator[str]:
        last, ttft, done = None, None, False
        try:
            if job.kind == "chat":
                yield f"data: {json.dumps(_chunk(job, None, None, first=True))}\n\n"
            while True:
                item = await job.handle.queue.get()
                if isinstance(item, Exception):
                    err = _engine_error(item)
                    yield f"data: {json.dumps(err.body())}\n\n"
                    done = True
                    break
                ttft = ttft if ttft is not None else time.monotonic() - job.start
                last = item
                if item.text:
                    yield f"data: {json.dumps(_chunk(job, item.text, None))}\n\n"
                if item.finished:
                    yield f"data: {json.dumps(_chunk(job, None, item.finish_reason))}\n\n"
                    if job.parsed.include_usage:
                        usage = {**_chunk(job, None, None), "choices": [], "usage": _usage(job, item)}
                        yield f"data: {json.dumps(usage)}\n\n"
                    done = True
                    _finish(job, ttft, last, item.finish_reason or "stop")
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not done:  # client went away mid-stream
                aengine.abort(job.rid)
                _finish(job, ttft, last, "abort")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "warmpath",
            "max_model_len": engine.max_model_len}]}

    @app.get("/health")
    async def health() -> Response:
        if not aengine.alive:
            return JSONResponse({"status": "error", "detail": "engine thread stopped"}, 503)
        return JSONResponse({"status": "ok"})

    from warmpath.worker.internal import add_internal_routes

    add_internal_routes(app, engine, aengine, _admit, _respond)

    @app.get("/metrics")
    async def prom() -> Response:
        metrics.refresh()
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _engine_error(e: Exception) -> APIError:
    if isinstance(e, ValueError):
        return bad("body", str(e))
    return APIError(500, str(e), err_type="server_error")

"""OpenAI-compatible HTTP API of one worker (FastAPI)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from warmpath.engine.async_engine import AsyncEngine, EngineFailed, RequestFailed, RequestHandle
from warmpath.engine.llm_engine import LLMEngine, RequestOutput
from warmpath.engine.sequence import SamplingParams
from warmpath.models.tokenizer import ChatTemplateError
from warmpath.protocol.auth import require_api_key, require_cluster_token
from warmpath.protocol.errors import APIError, bad
from warmpath.protocol.http import DEFAULT_MAX_BODY_BYTES, JSONRoute, install_error_handlers
from warmpath.protocol.openai import (ChatCompletionRequest, CompletionRequest, SamplingFields,
                                      check_prompt_chars)
from warmpath.server.metrics import EngineMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    """HTTP front settings."""

    host: str = "127.0.0.1"
    port: int = 8000
    default_max_tokens: int = 1024
    disconnect_poll_s: float = 0.25
    registration: object | None = None   # worker.registration.RegistrationConfig when behind a router
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_waiting: int = 4096              # requests queued in the scheduler beyond which we answer 429
    exit_on_engine_failure: bool = True  # shut down (exit code 1) so a supervisor restarts the worker
    fault_injection: bool = False        # POST /internal/fault (tests and chaos runs only)
    cluster_token: str | None = field(default=None, repr=False)   # required on /internal/* (None: open)
    api_keys: tuple[str, ...] = field(default=(), repr=False)     # one required on /v1/* (none: open)

    def __post_init__(self) -> None:
        if self.max_waiting <= 0:
            raise ValueError(f"max_waiting must be > 0, got {self.max_waiting}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {self.max_body_bytes}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.default_max_tokens <= 0:
            raise ValueError(f"default_max_tokens must be > 0, got {self.default_max_tokens}")


@dataclass
class _Job:
    rid: str
    kind: str                # "chat" | "text"
    handle: RequestHandle
    parsed: SamplingFields
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

    async def on_engine_death() -> None:
        """The engine thread stopped: tell the router at once, then exit for a restart."""
        await aengine.dead.wait()
        detail = f"engine thread stopped: {aengine.error!r}"
        log.error("%s; reporting unhealthy%s", detail, " and exiting" if cfg.exit_on_engine_failure else "")
        if cfg.registration is not None:
            from warmpath.worker.registration import report_unhealthy

            await report_unhealthy(cfg.registration, detail)
        if cfg.exit_on_engine_failure:   # the CLI's uvicorn server, else a plain SIGTERM
            getattr(app.state, "request_exit", lambda: os.kill(os.getpid(), signal.SIGTERM))()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        aengine.start()
        tasks = [asyncio.create_task(on_engine_death())]
        if cfg.registration is not None:
            from warmpath.worker.registration import register_and_heartbeat

            tasks.append(asyncio.create_task(register_and_heartbeat(
                cfg.registration, engine, lambda: aengine.alive)))
        yield
        for task in tasks:
            task.cancel()
        aengine.shutdown()

    app = FastAPI(title="warmpath", lifespan=lifespan)
    app.router.route_class = JSONRoute
    app.state.engine, app.state.aengine, app.state.metrics = engine, aengine, metrics
    app.state.max_body_bytes = cfg.max_body_bytes
    install_error_handlers(app, on_client_error=lambda _status: metrics.rejected.labels(model_name).inc())
    # Behind a router with no keys of its own, a worker's /v1/* needs the cluster token: the
    # router's API keys must not be bypassed by calling a worker directly.
    behind_router = cfg.registration is not None and cfg.cluster_token
    public = [Depends(require_api_key(cfg.api_keys or ((cfg.cluster_token,) if behind_router else ())))]
    internal = [Depends(require_cluster_token(cfg.cluster_token))]

    def _admit(parsed: SamplingFields, prompt: list[int], kind: str, param: str,
               output_prefix: list[int] | None = None, run_tokens: int | None = None) -> _Job:
        if parsed.model is not None and parsed.model not in aliases:
            raise APIError(400, f"model {parsed.model!r} does not exist; available: {model_name!r}",
                           param="model", code="model_not_found")
        if not aengine.alive:
            raise APIError(503, "engine is not running", code="engine_failed")
        if len(engine.scheduler.waiting) >= cfg.max_waiting:
            raise APIError(429, f"the worker's waiting queue is full ({cfg.max_waiting} requests); "
                                "retry later", headers={"Retry-After": "1"})
        room = engine.max_model_len - len(prompt)
        max_tokens = parsed.max_new_tokens or max(1, min(cfg.default_max_tokens, room))
        try:
            engine.check_prompt(len(prompt), max_tokens)
        except ValueError as e:
            field = param if parsed.max_new_tokens is None or room <= 0 else parsed.max_tokens_field
            raise bad(field, f"{field}: {e}") from e
        vocab = engine.loaded.config.vocab_size
        if any(t >= vocab for t in prompt):
            raise bad(param, f"token ids must be in [0, {vocab})")
        if any(t >= vocab for t in parsed.stop_token_ids):
            raise bad("stop_token_ids", f"token ids must be in [0, {vocab})")
        if output_prefix and any(t >= vocab for t in output_prefix):
            raise bad("first_token", f"token ids must be in [0, {vocab})")
        try:
            params = SamplingParams(max_tokens=run_tokens or max_tokens, **parsed.sampling_kwargs())
        except ValueError as e:
            raise bad("body", str(e)) from e
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        handle = aengine.add_request(rid, prompt, params, parsed.cache_salt, output_prefix)
        return _Job(rid, kind, handle, parsed, len(prompt), time.monotonic())

    def _chat_ids(body: ChatCompletionRequest) -> list[int]:
        try:
            text = tok.apply_chat_template(body.flat_messages(), add_generation_prompt=True)
        except ChatTemplateError as e:
            raise bad("messages", str(e)) from e
        return tok.encode(text, add_special=False)

    @app.post("/v1/chat/completions", dependencies=public)
    async def chat(body: ChatCompletionRequest, req: Request) -> Response:
        if tok is None:
            raise bad("messages", "this model has no tokenizer; send token ids to /v1/completions")
        check_prompt_chars(body.prompt_chars(), engine.max_model_len, "messages")
        ids = await asyncio.to_thread(_chat_ids, body)   # a long prompt must not stall the loop
        return await _respond(req, _admit(body, ids, "chat", "messages"))

    @app.post("/v1/completions", dependencies=public)
    async def completions(body: CompletionRequest, req: Request) -> Response:
        prompt = body.prompt
        if isinstance(prompt, str):
            if tok is None:
                raise bad("prompt", "this model has no tokenizer; send token ids")
            check_prompt_chars(len(prompt), engine.max_model_len, "prompt")
            prompt = await asyncio.to_thread(tok.encode, prompt)
        return await _respond(req, _admit(body, prompt, "text", "prompt"))

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

    @app.get("/v1/models", dependencies=public)
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "warmpath",
            "max_model_len": engine.max_model_len}]}

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: the engine runs and its waiting queue has room."""
        if not aengine.alive:
            return JSONResponse({"status": "not ready", "detail": "engine thread stopped"}, 503)
        if len(engine.scheduler.waiting) >= cfg.max_waiting:
            return JSONResponse({"status": "not ready", "detail": "waiting queue full"}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/health")
    async def health() -> Response:
        if not aengine.alive:
            return JSONResponse({"status": "error", "detail": "engine thread stopped"}, 503)
        return JSONResponse({"status": "ok"})

    from warmpath.worker.internal import add_fault_routes, add_internal_routes

    add_internal_routes(app, engine, aengine, _admit, _respond, _engine_error, dependencies=internal)
    if cfg.fault_injection:
        add_fault_routes(app, aengine, dependencies=internal)

    @app.get("/metrics")
    async def prom() -> Response:
        metrics.refresh()
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _engine_error(e: Exception) -> APIError:
    """What a request's failure inside the engine tells the client (and the router: 503
    ``engine_failed`` means no token was produced and another worker may take it)."""
    if isinstance(e, ValueError):
        return bad("body", str(e))
    if isinstance(e, EngineFailed):
        return APIError(503, str(e), code="engine_failed")
    if isinstance(e, RequestFailed):
        return APIError(500, f"the request failed in the engine: {e}", code="request_failed")
    return APIError(500, str(e))

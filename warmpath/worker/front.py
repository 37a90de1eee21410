"""A worker's per-request front: admission into the engine and the OpenAI response (JSON
or SSE), shared by the public routes and the router's ``/internal/*`` routes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from warmpath.engine.async_engine import AsyncEngine, EngineFailed, RequestFailed, RequestHandle
from warmpath.engine.request_output import RequestOutput
from warmpath.engine.sequence import SamplingParams
from warmpath.models.generation import resolve_defaults, table_entry
from warmpath.protocol.errors import APIError, bad
from warmpath.protocol.openai import SamplingFields
from warmpath.worker.metrics import EngineMetrics


@dataclass
class Job:
    """One admitted request as the HTTP side follows it."""

    rid: str
    kind: str                # "chat" | "text"
    handle: RequestHandle
    parsed: SamplingFields
    prompt_tokens: int
    start: float
    prefill: dict | None = None       # the prefill stage's measurements, relayed (handoff)
    handoff: bool = False             # the first token came from a prefill worker


def engine_error(e: Exception) -> APIError:
    """What a request's failure inside the engine tells the client (and the router: 503
    ``engine_failed`` means no token was produced and another worker may take it)."""
    if isinstance(e, ValueError):
        return bad("body", str(e))
    if isinstance(e, EngineFailed):
        return APIError(503, str(e), code="engine_failed")
    if isinstance(e, RequestFailed):
        return APIError(500, f"the request failed in the engine: {e}", code="request_failed")
    return APIError(500, str(e))


class WorkerFront:
    """Admits validated requests into the engine and renders their outputs.

    ``defaults``: what a request that leaves a sampling field (or ``max_tokens``) out gets
    (``models.generation``: ``cfg.generation_override`` > the model's generation config >
    its card > neutral; ``max_tokens`` always capped at the context left)."""

    def __init__(self, aengine: AsyncEngine, metrics: EngineMetrics, cfg) -> None:
        self.aengine, self.engine, self.metrics, self.cfg = aengine, aengine.engine, metrics, cfg
        loaded = self.engine.loaded
        self.model_name = loaded.model_id
        self.aliases = {self.model_name, self.engine.cfg.model}
        self.defaults = resolve_defaults(cfg.generation_override, loaded.generation_config,
                                         table_entry(loaded.model_id), cfg.default_max_tokens,
                                         loaded.generation_source)

    # -- admission ---------------------------------------------------------
    def admit(self, parsed: SamplingFields, prompt: list[int], kind: str, param: str,
              output_prefix: list[int] | None = None, run_tokens: int | None = None) -> Job:
        """Check what only the engine knows (model, context, vocabulary, queue room), then
        queue the request; raises :class:`APIError` (4xx naming the field, 429, 503)."""
        engine, cfg = self.engine, self.cfg
        if parsed.model is not None and parsed.model not in self.aliases:
            raise APIError(400, f"model {parsed.model!r} does not exist; available: {self.model_name!r}",
                           param="model", code="model_not_found")
        if not self.aengine.alive:
            raise APIError(503, "engine is not running", code="engine_failed")
        if len(engine.scheduler.waiting) >= cfg.max_waiting:
            raise APIError(429, f"the worker's waiting queue is full ({cfg.max_waiting} requests); "
                                "retry later", headers={"Retry-After": "1"})
        room = engine.max_model_len - len(prompt)
        max_tokens = parsed.max_new_tokens or max(1, min(self.defaults.max_tokens, room))
        try:
            engine.check_prompt(len(prompt), max_tokens)
        except ValueError as e:
            field = param if parsed.max_new_tokens is None or room <= 0 else parsed.max_tokens_field
            raise bad(field, f"{field}: {e}") from e
        vocab = engine.loaded.config.vocab_size
        for name, ids in ((param, prompt), ("stop_token_ids", parsed.stop_token_ids),
                          ("first_token", output_prefix or ())):
            if any(t >= vocab for t in ids):
                raise bad(name, f"token ids must be in [0, {vocab})")
        try:
            params = SamplingParams(max_tokens=run_tokens or max_tokens, priority=parsed.priority or 0,
                                    **parsed.sampling_kwargs(self.defaults.sampling()))
        except ValueError as e:
            raise bad("body", str(e)) from e
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        handle = self.aengine.add_request(rid, prompt, params, parsed.cache_salt, output_prefix)
        return Job(rid, kind, handle, parsed, len(prompt), time.monotonic())

    # -- rendering ---------------------------------------------------------
    def usage(self, job: Job, o: RequestOutput | None) -> dict:
        """OpenAI usage; ``cached_tokens`` is the prefill stage's measurement when there was
        one, else this worker's. ``usage["warmpath"]`` has each stage's own measurements:
        ``prefill`` (relayed from the prefill worker) and this worker's (``decode`` for a
        handoff, else ``worker``): prompt tokens whose KV it reused (L1) or loaded (L2/L3),
        those it recomputed, and the seconds its L3 loads took (the router learns this
        worker's L3 read line from them)."""
        done = o.completion_tokens if o else 0
        own = o.cached_tokens if o else 0
        cached = job.prefill["cached_tokens"] if job.prefill is not None else own
        ext: dict = {} if job.prefill is None else {"prefill": job.prefill}
        if o is not None and o.cached_by_tier is not None:
            ext["decode" if job.handoff else "worker"] = {
                "loaded_tokens": o.cached_by_tier, "recomputed_tokens": job.prompt_tokens - own,
                "l3_load_s": round(o.l3_load_s, 6)}
        return {"prompt_tokens": job.prompt_tokens, "completion_tokens": done,
                "total_tokens": job.prompt_tokens + done,
                "prompt_tokens_details": {"cached_tokens": cached}, "warmpath": ext}

    def chunk(self, job: Job, text: str | None, reason: str | None, first: bool = False) -> dict:
        if job.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return {"id": job.rid, "object": obj, "created": int(time.time()), "model": self.model_name,
                "choices": [choice]}

    def finish(self, job: Job, ttft: float | None, last: RequestOutput | None, reason: str) -> None:
        self.metrics.on_finish(ttft, time.monotonic() - job.start, job.prompt_tokens,
                               last.completion_tokens if last else 0, reason)

    async def respond(self, req: Request, job: Job) -> Response:
        """The whole answer (JSON), or a stream of SSE chunks when the request streams."""
        if job.parsed.stream:
            return StreamingResponse(self.stream(job), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        texts, last, ttft, first_queue = [], None, None, 0.0
        poll = self.cfg.disconnect_poll_s
        next_check = time.monotonic() + poll
        try:
            while True:
                try:
                    item = await asyncio.wait_for(job.handle.queue.get(), poll)
                except asyncio.TimeoutError:
                    item = None
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + poll
                    if await req.is_disconnected():
                        self.aengine.abort(job.rid)
                        self.finish(job, ttft, last, "abort")
                        return Response(status_code=499)
                if item is None:
                    continue
                if isinstance(item, Exception):
                    raise engine_error(item)
                if ttft is None:
                    ttft, first_queue = time.monotonic() - job.start, item.queue_time or 0.0
                texts.append(item.text)
                last = item
                if item.finished:
                    break
        except asyncio.CancelledError:
            self.aengine.abort(job.rid)
            raise
        self.finish(job, ttft, last, last.finish_reason or "stop")
        return self._whole(job, "".join(texts), last, {"X-Warmpath-Ttft-S": f"{ttft:.6f}",
                                                       "X-Warmpath-Queue-S": f"{first_queue:.6f}"})

    def _whole(self, job: Job, text: str, last: RequestOutput, headers: dict) -> JSONResponse:
        if job.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": last.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}
            obj = "text_completion"
        return JSONResponse({"id": job.rid, "object": obj, "created": int(time.time()),
                             "model": self.model_name, "choices": [choice], "usage": self.usage(job, last)},
                            headers=headers)

    async def stream(self, job: Job) -> AsyncIterator[str]:
        last, ttft, done = None, None, False
        try:
            if job.kind == "chat":
                yield f"data: {json.dumps(self.chunk(job, None, None, first=True))}\n\n"
            while True:
                item = await job.handle.queue.get()
                if isinstance(item, Exception):
                    yield f"data: {json.dumps(engine_error(item).body())}\n\n"
                    done = True
                    break
                ttft = ttft if ttft is not None else time.monotonic() - job.start
                last = item
                if item.text:
                    yield f"data: {json.dumps(self.chunk(job, item.text, None))}\n\n"
                if item.finished:
                    yield f"data: {json.dumps(self.chunk(job, None, item.finish_reason))}\n\n"
                    if job.parsed.include_usage:
                        usage = {**self.chunk(job, None, None), "choices": [], "usage": self.usage(job, item)}
                        yield f"data: {json.dumps(usage)}\n\n"
                    done = True
                    self.finish(job, ttft, last, item.finish_reason or "stop")
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not done:  # client went away mid-stream
                self.aengine.abort(job.rid)
                self.finish(job, ttft, last, "abort")

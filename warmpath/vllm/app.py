"""The HTTP face of a vLLM worker: what the router calls, relayed to the vLLM server beside it.

``POST /internal/generate`` (cluster token): :class:`~warmpath.protocol.internal.GenerateRequest`
→ vLLM's ``/v1/completions`` (``relay.py``) → the client's OpenAI answer, JSON or SSE, in the
shape warmpath's workers give it; with ``kv_transfer_params`` (a P/D hand-off) vLLM pulls the
prompt's KV through its connector first. ``POST /internal/prefill`` (a worker with a KV
connector only): the prefill side of vLLM's disaggregated protocol (``pd.py``) → a
:class:`~warmpath.protocol.internal.PrefillReply` carrying vLLM's ``kv_transfer_params``. vLLM unreachable: 503 ``engine_failed`` (the router retries
elsewhere). A client that leaves closes the upstream stream, and vLLM aborts the request.
``GET /health`` (the vLLM process runs; its URL and pid), ``/ready`` (it answers), ``/metrics`` (vLLM's own
exposition plus the event relay's ``warmpath_vllm_events_*`` counters), ``/v1/models``.
``GET /internal/kv/cached`` (cluster token): the blocks vLLM has cached by its own events
(:class:`~warmpath.protocol.internal.CachedBlocks`), which index fidelity measures against.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import httpx
import orjson
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from httpx_sse import EventSource

from warmpath.models.generation import GenerationDefaults
from warmpath.protocol.auth import require_api_key, require_cluster_token
from warmpath.protocol.errors import APIError
from warmpath.protocol.http import DEFAULT_MAX_BODY_BYTES, JSONRoute, install_error_handlers
from warmpath.protocol.internal import CachedBlocks, GenerateRequest, PrefillReply, PrefillRequest
from warmpath.protocol.openapi import ChatCompletion, TextCompletion, errors, generation, publish, status
from warmpath.vllm.load import RelayBook
from warmpath.vllm.pd import decode_body, prefill_body, prefill_reply
from warmpath.vllm.relay import Answer, completion_body, upstream_error, vllm_defaults

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrontConfig:
    """What the HTTP face needs to know about the vLLM server behind it."""

    vllm_url: str
    model: str                                   # vLLM's --served-model-name (and the router's id)
    max_model_len: int
    defaults: GenerationDefaults = GenerationDefaults()
    aliases: tuple[str, ...] = ()                # other names a request may use for the model
    vllm_pid: int | None = None                  # shown on /health (tests, operators)
    request_timeout_s: float = 600.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cluster_token: str | None = field(default=None, repr=False)
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    kv_connector: bool = False                   # vLLM runs a KV connector: P/D hand-offs allowed


def build_vllm_front(cfg: FrontConfig, alive: Callable[[], bool], relay_stats: Callable[[], dict],
                     book: RelayBook, cached: Callable[[], dict]) -> FastAPI:
    """The app (the caller owns the vLLM process, the relay and the registration, and closes
    ``app.state.http``, the client to vLLM, when the app stops). ``relay_stats`` and
    ``cached``: the event relay's counters and :meth:`~warmpath.vllm.event_relay.EventRelay.cached`."""
    app = FastAPI(title="warmpath vLLM worker")
    app.router.route_class = JSONRoute
    publish(app)
    app.state.max_body_bytes = cfg.max_body_bytes
    install_error_handlers(app)
    http = httpx.AsyncClient(base_url=cfg.vllm_url, timeout=httpx.Timeout(cfg.request_timeout_s, connect=5))
    app.state.http = http
    internal = [Depends(require_cluster_token(cfg.cluster_token))]
    public = [Depends(require_api_key(cfg.api_keys or ((cfg.cluster_token,) if cfg.cluster_token else ())))]
    aliases = {cfg.model, *cfg.aliases}

    async def open_stream(body: dict) -> httpx.Response:
        try:
            up = await http.send(http.build_request("POST", "/v1/completions", json=body), stream=True)
        except httpx.HTTPError as e:
            raise APIError(503, f"vLLM server not reachable: {type(e).__name__}", code="engine_failed") from e
        if up.status_code != 200:
            content = await up.aread()
            await up.aclose()
            raise upstream_error(up.status_code, content)
        return up

    async def chunks(up: httpx.Response, ans: Answer) -> AsyncIterator[dict]:
        """vLLM's events as warmpath's chunks; the relay book follows the request (and gives
        its batch at the end, before the usage goes out with the timings)."""
        first = True
        async for ev in EventSource(up).aiter_sse():
            if ev.data == "[DONE]":
                break
            data = orjson.loads(ev.data)
            if "error" in data or data.get("object") == "error":
                raise upstream_error(500, ev.data.encode())
            for c in ans.feed(data):
                if first:
                    book.first_token(ans.rid)
                    first = False
                yield c
        done(ans)

    done = functools.partial(_finished, book)

    @app.post("/internal/generate", dependencies=internal,
              responses=generation(ChatCompletion | TextCompletion, 429, 500, 503))
    async def generate(body: GenerateRequest) -> Response:
        req = completion_body(body, cfg.model, aliases, cfg.defaults, cfg.max_model_len)
        if body.kv_transfer_params is not None:
            if not cfg.kv_connector:
                raise APIError(400, "kv_transfer_params: this vLLM worker runs no KV connector", param="kv_transfer_params")
            req = decode_body(req, body.kv_transfer_params)
        ans = Answer(body.kind, cfg.model, len(body.prompt_token_ids), handed_off=body.kv_transfer_params is not None)
        book.started(ans.rid, 0 if ans.handed_off else ans.prompt_tokens)
        try:
            up = await open_stream(req)
        except BaseException:
            book.finished(ans.rid)
            raise
        if body.request.stream:
            return StreamingResponse(_sse(up, ans, chunks, done, body.request.include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            async for _ in chunks(up, ans):
                pass
        finally:
            await up.aclose()
            done(ans)
        return JSONResponse(ans.whole(), headers={"X-Warmpath-Ttft-S": f"{ans.ttft or 0.0:.6f}"})

    _handoff_routes(app, cfg, internal, http, book, cached, aliases)
    _status_routes(app, cfg, alive, relay_stats, public, http)
    return app


async def _sse(up: httpx.Response, ans: Answer, chunks, done, include_usage: bool) -> AsyncIterator[bytes]:
    """The client's SSE stream; an upstream failure mid-stream ends it with an error event."""
    try:
        if ans.kind == "chat":
            yield b"data: " + orjson.dumps(ans.chunk(None, None, first=True)) + b"\n\n"
        async for c in chunks(up, ans):
            yield b"data: " + orjson.dumps(c) + b"\n\n"
        if include_usage:
            yield b"data: " + orjson.dumps(ans.usage_chunk()) + b"\n\n"
    except (httpx.HTTPError, APIError, ValueError) as e:
        err = e if isinstance(e, APIError) else APIError(502, f"vLLM failed mid-stream: {type(e).__name__}")
        yield b"data: " + orjson.dumps(err.body()) + b"\n\n"
    finally:
        await up.aclose()
        done(ans)
    yield b"data: [DONE]\n\n"


def _finished(book: RelayBook, ans: Answer) -> None:
    """The request left vLLM (once: later calls do nothing)."""
    if ans.batch is not None:
        return
    u = ans.usage or {}
    computed = u.get("prompt_tokens", 0) - (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    # a hand-off's first token came after a KV pull, not a prefill: no prefill speed from it
    ans.batch = book.finished(ans.rid, computed if u and not ans.handed_off else None, ans.ttft)


def _handoff_routes(app: FastAPI, cfg: FrontConfig, internal: list, http: httpx.AsyncClient, book: RelayBook,
                    cached: Callable[[], dict], aliases: set) -> None:
    """``/internal/prefill`` (the prefill side of vLLM's P/D) and ``/internal/kv/cached`` (the
    relay's truth of what vLLM caches, for index fidelity)."""

    @app.post("/internal/prefill", dependencies=internal, responses=errors(400, 401, 502, 503))
    async def prefill(body: PrefillRequest) -> PrefillReply:
        """The prefill side of a hand-off: the prompt computed by vLLM and kept for the decode side."""
        if not cfg.kv_connector:
            raise APIError(400, "this vLLM worker runs no KV connector (--vllm-kv-connector): it takes no prefill")
        msg = GenerateRequest(kind="text", prompt_token_ids=body.prompt_token_ids, request=body.request)
        req = prefill_body(completion_body(msg, cfg.model, aliases, cfg.defaults, cfg.max_model_len))
        sent, rid, reply = time.monotonic(), f"prefill-{uuid.uuid4().hex}", None
        book.started(rid, len(body.prompt_token_ids))
        try:
            r = await http.post("/v1/completions", json=req)
            if r.status_code != 200:
                raise upstream_error(r.status_code, r.content)
            reply = prefill_reply(r.json(), len(body.prompt_token_ids), time.monotonic() - sent)
        except httpx.HTTPError as e:
            raise APIError(503, f"vLLM server not reachable: {type(e).__name__}", code="engine_failed") from e
        finally:   # the prefill speed this worker reports is learnt from its own prefills
            book.finished(rid, reply and reply.prompt_tokens - reply.cached_tokens, reply and reply.prefill_s)
        return reply

    @app.get("/internal/kv/cached", dependencies=internal, responses=errors(401))
    async def kv_cached() -> CachedBlocks:
        return CachedBlocks(**cached())


def _status_routes(app: FastAPI, cfg: FrontConfig, alive: Callable[[], bool], relay_stats: Callable[[], dict],
                   public: list, http: httpx.AsyncClient) -> None:
    @app.get("/health", responses=status(503))
    async def health() -> Response:
        """Liveness: 503 once the vLLM process exited."""
        if not alive():
            return JSONResponse({"status": "error", "detail": "the vLLM server exited"}, 503)
        return JSONResponse({"status": "ok", "engine": "vllm", "vllm_url": cfg.vllm_url, "vllm_pid": cfg.vllm_pid})

    @app.get("/ready", responses=status(503))
    async def ready() -> Response:
        """Readiness: the vLLM server answers its own ``/health``."""
        try:
            ok = alive() and (await http.get("/health", timeout=2)).status_code == 200
        except httpx.HTTPError:
            ok = False
        return JSONResponse({"status": "ready" if ok else "not ready"}, 200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse, responses=errors(503))
    async def metrics() -> Response:
        try:
            text = (await http.get("/metrics", timeout=5)).text
        except httpx.HTTPError as e:
            raise APIError(503, f"vLLM server not reachable: {type(e).__name__}", code="engine_failed") from e
        ours = "".join(f"# TYPE warmpath_vllm_events_{k} gauge\nwarmpath_vllm_events_{k} {v}\n"
                       for k, v in relay_stats().items())
        return PlainTextResponse(text.rstrip("\n") + "\n" + ours, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=public, responses=errors(401))
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": cfg.model, "object": "model", "created": 0, "owned_by": "vllm",
            "max_model_len": cfg.max_model_len,
            "generation_defaults": vllm_defaults(cfg.defaults).to_json()}]}

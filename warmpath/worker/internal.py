"""Worker endpoints the router calls in disaggregated topologies (not part of the OpenAI API).

``POST /internal/prefill`` ``{"prompt_token_ids": [...], "request": <the client's body>}``
    Runs the prompt to its first token. With write-through (the default for prefill roles)
    every sealed block of the prompt is in L3 before the answer leaves: that is the P→D
    handoff. Answers ``{"token", "prompt_tokens", "cached_tokens", "queue_s", "prefill_s",
    "kv_blocks", "kv_bytes", "l3_get_s", "l3_put_s"}`` (the L3 seconds are the worker's while the
    request ran: other requests' reads and writes in that time are in them too).

``POST /internal/generate`` ``{"kind": "chat"|"text", "prompt_token_ids", "request",
"first_token"?, "cached_tokens"?}``
    The client's OpenAI response (streamed or not). With ``first_token`` this is the decode
    side of a handoff: the token is reported at once, the prompt's blocks come from L3 (or
    are recomputed when missing), generation continues after it. Without it the worker
    computes the prompt itself: a PPD append-prefill on a decode worker, or a replica.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from warmpath.engine.async_engine import AsyncEngine
from warmpath.engine.llm_engine import LLMEngine
from warmpath.server.protocol import APIError, bad, parse_common


def _ids(body: Any, key: str) -> list[int]:
    ids = body.get(key) if isinstance(body, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
        raise bad(key, f"{key} must be a non-empty list of token ids")
    return ids


async def _json(req: Request) -> dict:
    try:
        body = await req.json()
    except ValueError as e:
        raise bad("body", f"malformed JSON body: {e}") from e
    if not isinstance(body, dict):
        raise bad("body", "expected a JSON object")
    return body


def _request(body: dict) -> dict:
    req = body.get("request")
    if not isinstance(req, dict):
        raise bad("request", "request must be the client's JSON object")
    return req


def add_internal_routes(app: FastAPI, engine: LLMEngine, aengine: AsyncEngine,
                        admit: Callable, respond: Callable) -> None:
    """Register ``/internal/prefill`` and ``/internal/generate`` on a worker's app."""

    def l3_seconds() -> tuple[float, float]:
        """This worker's cumulative L3 (read, write) seconds."""
        t = engine.tiers
        return (t.l3.stats.read_seconds, t.l3.stats.write_seconds) if t is not None and t.l3 is not None else (0.0, 0.0)

    @app.post("/internal/prefill")
    async def prefill(req: Request) -> Response:
        body = await _json(req)
        ids = _ids(body, "prompt_token_ids")
        parsed = parse_common(_request(body))
        (get0, put0), t0 = l3_seconds(), time.monotonic()
        job = admit(parsed, ids, "text", "prompt_token_ids", run_tokens=1)
        while True:
            try:
                item = await asyncio.wait_for(job.handle.queue.get(), 0.25)
            except asyncio.TimeoutError:
                if await req.is_disconnected():
                    aengine.abort(job.rid)
                    return Response(status_code=499)
                continue
            if isinstance(item, Exception):
                status = 400 if isinstance(item, ValueError) else 500
                raise APIError(status, str(item), err_type="server_error" if status == 500 else
                               "invalid_request_error")
            break
        blocks = len(ids) // engine.cfg.block_size
        block_bytes = engine.tiers.block_bytes if engine.tiers is not None else 0
        get1, put1 = l3_seconds()
        return JSONResponse({"token": item.new_token_ids[-1], "prompt_tokens": len(ids),
                             "cached_tokens": item.cached_tokens, "queue_s": item.queue_time or 0.0,
                             "prefill_s": time.monotonic() - t0, "kv_blocks": blocks,
                             "kv_bytes": blocks * block_bytes, "l3_get_s": get1 - get0, "l3_put_s": put1 - put0})

    @app.post("/internal/generate")
    async def generate(req: Request) -> Response:
        body = await _json(req)
        ids = _ids(body, "prompt_token_ids")
        parsed = parse_common(_request(body))
        kind = body.get("kind")
        if kind not in ("chat", "text"):
            raise bad("kind", "kind must be 'chat' or 'text'")
        first = body.get("first_token")
        if first is not None and not isinstance(first, int):
            raise bad("first_token", "first_token must be a token id")
        job = admit(parsed, ids, kind, "prompt_token_ids",
                    output_prefix=[first] if first is not None else None)
        if isinstance(body.get("cached_tokens"), int):
            job.cached_tokens = body["cached_tokens"]
        return await respond(req, job)

"""Relaying a worker's SSE stream to the client, event by event (``httpx-sse`` parses it).

The router asked the worker for the usage chunk (to count the tokens that went out); it is
passed on only when the client asked for it too. A worker that dies mid-stream ends the
client's stream with an OpenAI-shaped error event: tokens already went out, no retry.
"""

from __future__ import annotations

from typing import Callable

import httpx
import orjson
from fastapi.responses import StreamingResponse

from warmpath.protocol.errors import APIError
from warmpath.router.dispatch import UpstreamStream, chunk
from warmpath.router.state import RouterState
from warmpath.router.trip import Trip


def _usage_tokens(data: dict) -> int | None:
    """Completion tokens of the usage chunk (``choices`` empty), else ``None``."""
    if data.get("choices") == [] and isinstance(data.get("usage"), dict):
        return int(data["usage"].get("completion_tokens", 0))
    return None


def relay(s: RouterState, t: Trip, up: UpstreamStream, ended: Callable[[], None],
          headers: dict[str, str]) -> StreamingResponse:
    """The client's streaming response over ``up``; ``ended()`` runs once it is over."""
    want_usage = t.body.include_usage

    def out(ev) -> bytes | None:
        if '"usage"' in ev.data and (c := chunk(ev)) is not None and (n := _usage_tokens(c)) is not None:
            t.completion_tokens = n
            t.usage = c["usage"]
            if not want_usage:
                return None
        return b"data: " + ev.data.encode() + b"\n\n"

    async def events():
        try:
            for ev in up.head:
                if (b := out(ev)) is not None:
                    yield b
            async for ev in up.rest:
                if (b := out(ev)) is not None:
                    yield b
        except httpx.HTTPError as e:
            s.mid_stream_failures += 1
            s.metrics.failed.labels("stream").inc()
            err = APIError(502, f"worker {t.decision.decode} failed mid-stream: {type(e).__name__}",
                           err_type="server_error")
            yield b"data: " + orjson.dumps(err.body()) + b"\n\ndata: [DONE]\n\n"
        finally:
            await up.close()
            ended()

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

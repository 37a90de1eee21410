"""HTTP to the workers, and nothing else: ``/internal/prefill`` and ``/internal/generate``
with typed messages, failures sorted into retryable (:class:`WorkerUnreachable`: nothing
reached the client) and not (:class:`UpstreamError`: relay the worker's answer).

``RequestFlow`` (``flow.py``) decides what to call and keeps the books.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import httpx
import orjson
from httpx_sse import EventSource, ServerSentEvent
from pydantic import ValidationError

from warmpath.protocol.errors import APIError
from warmpath.protocol.internal import GenerateRequest, PrefillReply, PrefillRequest

RETRYABLE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)


class WorkerUnreachable(Exception):
    """The worker failed before anything reached the client (safe to retry elsewhere)."""


class UpstreamError(Exception):
    """A worker answered with an error status; relay it as is."""

    def __init__(self, status: int, content: bytes) -> None:
        super().__init__(status)
        self.status, self.content = status, content


def _engine_failed(status: int, content: bytes) -> bool:
    """A worker whose engine stopped answers 503 ``engine_failed``: nothing was computed for
    the request, so it may go to another worker."""
    return status == 503 and b'"engine_failed"' in content


def chunk(ev: ServerSentEvent) -> dict | None:
    """The JSON object an SSE event carries (``None`` for ``[DONE]`` or non-JSON data)."""
    if not ev.data.startswith("{"):
        return None
    try:
        out = orjson.loads(ev.data)
    except orjson.JSONDecodeError:
        return None
    return out if isinstance(out, dict) else None


def carries_token(ev: ServerSentEvent) -> bool:
    """Whether an event ends the wait for the first token: generated text, a finish, an
    error, or the end of the stream (not the chat role chunk)."""
    if ev.data == "[DONE]":
        return True
    c = chunk(ev)
    if c is None:
        return False
    return "error" in c or any((x.get("delta") or {}).get("content") or x.get("text") or x.get("finish_reason")
                               for x in c.get("choices") or [])


@dataclass
class UpstreamStream:
    """An open ``/internal/generate`` stream: the events up to the first token, the rest."""

    head: list[ServerSentEvent]
    rest: AsyncIterator[ServerSentEvent]
    response: httpx.Response

    async def close(self) -> None:
        await self.response.aclose()


class WorkerClient:
    """Calls workers by id (``url_of`` → base URL or ``None`` once dropped); a call gives up
    with :class:`WorkerUnreachable` when ``gone_of(worker)`` is set meanwhile."""

    def __init__(self, http: httpx.AsyncClient, url_of: Callable[[str], str | None],
                 gone_of: Callable[[str], asyncio.Event]) -> None:
        self.http, self.url_of, self.gone_of = http, url_of, gone_of

    def _url(self, worker: str, path: str) -> str:
        base = self.url_of(worker)
        if base is None:
            raise WorkerUnreachable(worker)
        return base + path

    async def _unless_lost(self, worker: str, aw):
        """Await ``aw`` unless ``worker`` is dropped first (no heartbeat, unhealthy): a
        request stuck on a host that vanished (a cut link leaves a kept-alive connection
        silent) is then retried elsewhere instead of waiting for the request timeout."""
        task = asyncio.ensure_future(aw)
        waiter = asyncio.ensure_future(self.gone_of(worker).wait())
        try:
            done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task in done:
            return task.result()
        task.cancel()
        raise WorkerUnreachable(worker)

    async def _post(self, worker: str, path: str, payload: dict) -> httpx.Response:
        try:
            r = await self._unless_lost(worker, self.http.post(self._url(worker, path), json=payload))
        except RETRYABLE as e:
            raise WorkerUnreachable(worker) from e
        if _engine_failed(r.status_code, r.content):
            raise WorkerUnreachable(worker)
        if r.status_code != 200:
            raise UpstreamError(r.status_code, r.content)
        return r

    async def prefill(self, worker: str, msg: PrefillRequest) -> PrefillReply:
        """Prompt → first token on a prefill worker (its blocks written through to L3)."""
        r = await self._post(worker, "/internal/prefill", msg.model_dump())
        try:
            return PrefillReply.model_validate_json(r.content)
        except ValidationError as e:
            err = APIError(502, f"worker {worker} answered a malformed prefill reply: {e.errors()[0].get('msg')}")
            raise UpstreamError(502, orjson.dumps(err.body())) from e

    async def generate(self, worker: str, msg: GenerateRequest) -> httpx.Response:
        """A non-streamed ``/internal/generate`` (status 200, else raised)."""
        return await self._post(worker, "/internal/generate", msg.model_dump(exclude_none=True))

    async def stream(self, worker: str, msg: GenerateRequest) -> UpstreamStream:
        """Open a streamed ``/internal/generate`` and read it up to the first token; any
        failure before that token is retryable."""
        return await self._unless_lost(worker, self._open(worker, msg))

    async def _open(self, worker: str, msg: GenerateRequest) -> UpstreamStream:
        req = self.http.build_request("POST", self._url(worker, "/internal/generate"),
                                      json=msg.model_dump(exclude_none=True))
        try:
            up = await self.http.send(req, stream=True)
        except RETRYABLE as e:
            raise WorkerUnreachable(worker) from e
        try:
            if up.status_code != 200:
                content = await up.aread()
                if _engine_failed(up.status_code, content):
                    raise WorkerUnreachable(worker)
                raise UpstreamError(up.status_code, content)
            events = EventSource(up).aiter_sse()
            head: list[ServerSentEvent] = []
            async for ev in events:
                head.append(ev)
                if carries_token(ev):
                    break
            if head and b"engine_failed" in head[-1].data.encode() and not any(map(carries_token, head[:-1])):
                raise WorkerUnreachable(worker)   # its engine stopped before this request got a token
        except RETRYABLE as e:
            await up.aclose()
            raise WorkerUnreachable(worker) from e
        except BaseException:
            await up.aclose()
            raise
        return UpstreamStream(head, events, up)

"""What the router's and the workers' OpenAPI schemas promise: every status a route answers,
in the shape it answers it.

FastAPI alone would publish a ``422`` with its own validation body on every route with a
body, while ``protocol.http`` answers ``400`` in OpenAI's error shape; it would also say
``application/json`` for a stream (``text/event-stream``) and for ``/metrics``. The
``responses=`` tables here say what the apps really send, and :func:`publish` drops the
``422`` that never happens, so a schema-driven client (or fuzzer) can check every answer.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict


class ErrorDetail(BaseModel):
    """``error`` of :class:`ErrorBody`: what went wrong, and the field when one is to blame."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error answer (``warmpath.protocol.errors.APIError.body``)."""

    error: ErrorDetail


class Usage(BaseModel):
    """Token counts of a finished answer (``usage["warmpath"]``: measured loads per stage)."""

    model_config = ConfigDict(extra="allow")
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatChoice(BaseModel):
    """One choice of a :class:`ChatCompletion`."""

    model_config = ConfigDict(extra="allow")
    index: int
    message: dict[str, Any]
    finish_reason: str | None


class TextChoice(BaseModel):
    """One choice of a :class:`TextCompletion`."""

    model_config = ConfigDict(extra="allow")
    index: int
    text: str
    finish_reason: str | None


class ChatCompletion(BaseModel):
    """A whole (not streamed) chat answer."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class TextCompletion(BaseModel):
    """A whole (not streamed) text answer."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class StatusBody(BaseModel):
    """``/health`` and ``/ready``: ``status`` (``ok``, ``ready``, ``not ready``, ``error``) and why."""

    model_config = ConfigDict(extra="allow")
    status: str
    detail: str | None = None


_WHY = {
    400: "invalid request (malformed or too deeply nested JSON, a field out of range, a prompt "
         "that does not fit the context); `param` names the field",
    401: "missing or wrong bearer credential (cluster token on /internal/*, API key on /v1/*)",
    404: "no such resource",
    409: "conflict with the current state",
    413: "request body over the size limit",
    429: "queue full; retry after `Retry-After` seconds",
    500: "the request failed inside the engine (it alone; the worker keeps serving)",
    502: "a worker answered something malformed",
    503: "no worker can take the request now, or the engine stopped",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the error statuses a route may answer."""
    return {s: {"model": ErrorBody, "description": _WHY[s]} for s in statuses}


# One server-sent event (OpenAPI before 3.2 reads ``schema`` of an event stream as one event's).
SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    "description": "`data`: a chunk (JSON), `[DONE]` at the end; a failure is an `{\"error\": ...}` chunk"}}}

# POST routes (body read by protocol.http.JSONRoute: malformed → 400, too big → 413, guard → 401)
BODY = (400, 401, 413)


def generation(model: type[BaseModel] | Any, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route that answers ``model`` as JSON, or an SSE stream when asked."""
    return {200: {"model": model, "content": SSE, "description": "the answer (JSON), or its stream"},
            **errors(*BODY, *statuses)}


def text(*media: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of a route that answers text of one of the ``media`` types."""
    return {200: {"content": {m: {"schema": {"type": "string"}} for m in media}, "description": "text"}}


def status(*down: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` of ``/health`` or ``/ready``: 200, or 503 (``down``) with the reason."""
    return {200: {"model": StatusBody, "description": "up"},
            **{s: {"model": StatusBody, "description": "not up, and why"} for s in down}}


def publish(app: FastAPI) -> None:
    """Serve ``/openapi.json`` without FastAPI's ``422`` answers (this app sends 400 instead)."""
    plain = app.openapi

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = plain()
            for ops in doc.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            comps = doc.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                comps.pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = schema

"""Bounded JSON bodies and OpenAI-shaped errors for the router's and the workers' FastAPI apps.

* :class:`JSONRoute` parses every body with ``orjson`` (strict JSON: no NaN/Infinity) under a
  size limit (413) and a nesting limit (400), whatever its ``Content-Type`` says, so no input
  reaches a recursion limit or the encoder when the router forwards it.
* :func:`install_error_handlers` renders every error as ``{"error": {...}}``: validation
  failures as 400 naming the field, unknown routes 404, wrong methods 405; only a bug of
  ours is a 500.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from warmpath.protocol.errors import APIError, error_type

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 << 20
MAX_JSON_DEPTH = 64
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def json_depth_ok(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``obj`` nests at most ``limit`` containers deep (iterative: no recursion)."""
    if not isinstance(obj, (dict, list)):
        return True
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return False
        stack.extend((c, d + 1) for c in (o.values() if isinstance(o, dict) else o)
                     if isinstance(c, (dict, list)))   # containers only: a flat array costs nothing
    return True


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON → Python, or a 400 that says what is wrong."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise APIError(400, f"malformed JSON body: {e}", param="body") from None
    if not json_depth_ok(obj, max_depth):
        raise APIError(400, f"JSON body nests deeper than {max_depth} levels", param="body")
    return obj


class BoundedRequest(Request):
    """A request whose body is read under ``app.state.max_body_bytes`` and parsed strictly."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            limit = getattr(self.app.state, "max_body_bytes", DEFAULT_MAX_BODY_BYTES)
            declared = self.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise APIError(413, f"request body of {int(declared)} bytes exceeds the limit of {limit}")
            chunks, size = [], 0
            async for chunk in self.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JSONRoute(APIRoute):
    """An ``APIRoute`` that reads bodies through :class:`BoundedRequest` and parses them as
    JSON even when the client forgot ``Content-Type: application/json`` (curl ``-d``).
    Its guards (``warmpath.protocol.auth``: dependencies marked ``before_body``) run before
    the body is read."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        guards = [d.dependency for d in self.dependencies if getattr(d.dependency, "before_body", False)]

        async def bounded(request: Request):
            for g in guards:
                await g(request)
            if request.method in ("POST", "PUT", "PATCH"):
                scope = request.scope
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope["headers"].append((b"content-type", b"application/json"))
            return await handler(BoundedRequest(request.scope, request.receive))

        return bounded


def _param(loc: tuple) -> str:
    """``("body", "messages", 0, "content", "str")`` → ``messages[0].content``."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part not in _TYPE_NAMES:
            out += f".{part}" if out else part
    return out or "body"


def validation_error(errors: list[dict]) -> APIError:
    """The most telling error of a failed validation, as a 400 naming its field.

    With unions (``stop``: a string or a list), the error of the branch whose shape matched
    says more than "Input should be a valid string": prefer errors that are not type mismatches,
    then the deepest (the first of equals).
    """
    if not errors:
        return APIError(400, "invalid request body", param="body")
    e = max(errors, key=lambda x: (not str(x.get("type", "")).endswith("_type"), len(x.get("loc", ()))))
    param = _param(tuple(e.get("loc", ())))
    msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
    if e.get("type") == "missing":
        msg = "field required"
    inp = e.get("input")
    if e.get("type") == "int_type" and isinstance(inp, float) and inp.is_integer() and abs(inp) >= 2**63:
        msg = "integer out of range"   # JSON integers beyond 64 bits arrive as floats (not 7.0)
    return APIError(400, f"'{param}': {msg}", param=param)


def install_error_handlers(app: FastAPI, on_client_error: Callable[[int], None] | None = None,
                           headers_for: Callable[[int], dict | None] | None = None) -> None:
    """Render every error in OpenAI's shape; ``on_client_error(status)`` counts 4xx."""

    def respond(e: APIError) -> JSONResponse:
        if on_client_error is not None and 400 <= e.status < 500:
            on_client_error(e.status)
        # the error's own headers win (a tenant's Retry-After over the default one)
        headers = {**((headers_for(e.status) if headers_for else None) or {}), **(e.headers or {})}
        return JSONResponse(e.body(), status_code=e.status, headers=headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, e: StarletteHTTPException) -> JSONResponse:
        if isinstance(e, APIError):
            return respond(e)
        msg = e.detail if isinstance(e.detail, str) else str(e.detail)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        return respond(APIError(e.status_code, msg, err_type=error_type(e.status_code), code=code,
                                headers=e.headers))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, e: RequestValidationError) -> JSONResponse:
        return respond(validation_error(list(e.errors())))

    @app.exception_handler(Exception)
    async def _bug(req: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", req.method, req.url.path)
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}").body(), status_code=500)

"""Errors returned to clients in OpenAI's error JSON shape."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error"}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status."""
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


class APIError(HTTPException):
    """An error for the client, rendered as ``{"error": {message, type, param, code}}``.

    It is an ``HTTPException`` so that FastAPI passes it through its own body reading
    (an oversized or too deeply nested body is reported as what it is).
    """

    def __init__(self, status: int, message: str, param: str | None = None,
                 err_type: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.status, self.message, self.param = status, message, param
        self.err_type, self.code = err_type or error_type(status), code

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type,
                          "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> APIError:
    """A 400 naming the offending field."""
    return APIError(400, message, param=param)

"""OpenAI request validation and error shapes (no web framework here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warmpath.engine.sequence import SamplingParams


class APIError(Exception):
    """An error returned to the client in OpenAI's error JSON shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 err_type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.err_type, self.code = err_type, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type,
                          "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def _typed(body: dict, key: str, types: tuple, type_name: str, default=None):
    v = body.get(key, default)
    if v is None:
        return default
    # bool is an int subclass: reject it where a number is expected.
    if isinstance(v, bool) and bool not in types:
        raise bad(key, f"'{key}' must be {type_name}, got a boolean")
    if not isinstance(v, types):
        raise bad(key, f"'{key}' must be {type_name}, got {type(v).__name__}")
    return v


@dataclass
class ParsedRequest:
    """What the server needs from a chat or completions request."""

    model: str | None
    stream: bool
    include_usage: bool
    params_kwargs: dict[str, Any]
    max_tokens: int | None
    user: str | None
    cache_salt: str | None


def parse_common(body: Any) -> ParsedRequest:
    """Validate fields shared by ``/v1/chat/completions`` and ``/v1/completions``."""
    if not isinstance(body, dict):
        raise bad("body", "request body must be a JSON object")
    model = _typed(body, "model", (str,), "a string")
    n = _typed(body, "n", (int,), "an integer", 1)
    if n != 1:
        raise bad("n", f"only n=1 is supported, got n={n}")
    stream = _typed(body, "stream", (bool,), "a boolean", False)
    so = _typed(body, "stream_options", (dict,), "an object", {})
    include_usage = bool(so.get("include_usage", False))
    max_tokens = _typed(body, "max_completion_tokens", (int,), "an integer")
    if max_tokens is None:
        max_tokens = _typed(body, "max_tokens", (int,), "an integer")
        field = "max_tokens"
    else:
        field = "max_completion_tokens"
    if max_tokens is not None and max_tokens <= 0:
        raise bad(field, f"'{field}' must be at least 1, got {max_tokens}")
    temperature = float(_typed(body, "temperature", (int, float), "a number", 1.0))
    if not 0 <= temperature <= 2:
        raise bad("temperature", f"'temperature' must be in [0, 2], got {temperature}")
    top_p = float(_typed(body, "top_p", (int, float), "a number", 1.0))
    if not 0 < top_p <= 1:
        raise bad("top_p", f"'top_p' must be in (0, 1], got {top_p}")
    top_k = _typed(body, "top_k", (int,), "an integer", 0)
    if top_k < 0 and top_k != -1:
        raise bad("top_k", f"'top_k' must be >= 0 (or -1 for off), got {top_k}")
    seed = _typed(body, "seed", (int,), "an integer")
    stop = body.get("stop")
    if stop is None:
        stop_t: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stop_t = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop_t = tuple(stop)
    else:
        raise bad("stop", "'stop' must be a string or a list of strings")
    if any(not s for s in stop_t) or len(stop_t) > 16:
        raise bad("stop", "'stop' strings must be non-empty, at most 16 of them")
    stop_ids = _typed(body, "stop_token_ids", (list,), "a list of integers", [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise bad("stop_token_ids", "'stop_token_ids' must be a list of integers")
    ignore_eos = _typed(body, "ignore_eos", (bool,), "a boolean", False)
    for key in ("presence_penalty", "frequency_penalty"):
        if _typed(body, key, (int, float), "a number", 0) != 0:
            raise bad(key, f"'{key}' is not supported (only 0)")
    if body.get("logprobs") not in (None, False):
        raise bad("logprobs", "'logprobs' is not supported")
    user = _typed(body, "user", (str,), "a string")
    cache_salt = _typed(body, "cache_salt", (str,), "a string")
    return ParsedRequest(model, stream, include_usage, dict(
        temperature=temperature, top_p=top_p, top_k=max(0, top_k), seed=seed, stop=stop_t,
        stop_token_ids=tuple(stop_ids), ignore_eos=ignore_eos), max_tokens, user, cache_salt)


def parse_messages(body: dict) -> list[dict[str, str]]:
    """Validate ``messages`` and flatten text content parts to strings."""
    if "messages" not in body:
        raise bad("messages", "'messages' is required")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", f"'messages[{i}]' must be an object")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "developer", "tool"):
            raise bad(f"messages[{i}].role", f"'messages[{i}].role' must be one of system, user, "
                                              f"assistant, developer, tool; got {role!r}")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise bad(f"messages[{i}].content", "only text content parts are supported")
                parts.append(p["text"])
            content = "".join(parts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content", f"'messages[{i}].content' must be a string")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse_prompt(body: dict) -> str | list[int]:
    """Validate a completions ``prompt``: a string, token ids, or a one-element list."""
    if "prompt" not in body:
        raise bad("prompt", "'prompt' is required")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        if not p:
            raise bad("prompt", "'prompt' must not be empty")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p
    raise bad("prompt", "'prompt' must be a non-empty string or a list of token ids "
                        "(batches of prompts are not supported)")


def make_params(parsed: ParsedRequest, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=max_tokens, **parsed.params_kwargs)
    except ValueError as e:
        raise bad("body", str(e)) from e

"""Bearer-token checks for the router's and the workers' apps.

* The **cluster token** (``--cluster-token`` / ``WARMPATH_CLUSTER_TOKEN``) guards the
  ``/internal/*`` routes (register, heartbeat, prefill, generate, fault) and the KV event
  sockets; without one configured they stay open (single-machine development).
* **API keys** (``--api-key`` / ``WARMPATH_API_KEY``) guard the public ``/v1/*`` routes.

Both travel as ``Authorization: Bearer <secret>`` and are compared in constant time. A
missing or wrong one is a 401 in OpenAI's error shape, raised before the body is read
(:class:`~warmpath.protocol.http.JSONRoute` runs these guards first).
"""

from __future__ import annotations

import hmac
import os
from typing import Callable, Iterable

from fastapi import Request

from warmpath.protocol.errors import APIError

CLUSTER_TOKEN_ENV = "WARMPATH_CLUSTER_TOKEN"
API_KEY_ENV = "WARMPATH_API_KEY"


def bearer(request: Request) -> str | None:
    """The credential of an ``Authorization: Bearer ...`` header, if any."""
    scheme, _, cred = request.headers.get("authorization", "").partition(" ")
    return (cred.strip() or None) if scheme.lower() == "bearer" else None


def matches(given: str | None, secrets: Iterable[str]) -> bool:
    """Whether ``given`` equals one of ``secrets`` (each compared in constant time)."""
    if not given:
        return False
    g = given.encode("utf-8", "surrogateescape")
    ok = False
    for s in secrets:
        ok |= hmac.compare_digest(g, s.encode())
    return ok


def cluster_token(flag: str | None) -> str | None:
    """``--cluster-token``, else ``$WARMPATH_CLUSTER_TOKEN``; ``None`` when neither is set."""
    return flag or os.environ.get(CLUSTER_TOKEN_ENV) or None


def api_key_specs(flags: list[str] | None) -> tuple[str, ...]:
    """``--api-key`` (repeatable), else ``$WARMPATH_API_KEY`` (several separated by commas),
    as given: ``KEY`` or ``KEY=TENANT`` (``routing/tenants.py``)."""
    keys = tuple(flags) if flags else tuple(k.strip() for k in os.environ.get(API_KEY_ENV, "").split(","))
    keys = tuple(k for k in keys if k)
    for k in keys:
        if "," in k or any(c.isspace() for c in k):
            raise ValueError("--api-key: a key must not contain commas or whitespace")
        if not k.partition("=")[0]:
            raise ValueError(f"--api-key {k!r}: the key before '=TENANT' is empty")
    return keys


def api_keys(flags: list[str] | None) -> tuple[str, ...]:
    """The API keys themselves (``KEY`` of each ``KEY=TENANT``)."""
    return tuple(k.partition("=")[0] for k in api_key_specs(flags))


def guard(check: Callable[[Request], None]) -> Callable:
    """A FastAPI dependency that :class:`~warmpath.protocol.http.JSONRoute` also runs before
    it reads the body (so an unauthenticated body is never parsed)."""

    async def dependency(request: Request) -> None:
        check(request)

    dependency.before_body = True
    return dependency


def require_cluster_token(token: str | None) -> Callable:
    """Dependency: the cluster token, when one is configured."""

    def check(request: Request) -> None:
        if token and not matches(bearer(request), (token,)):
            raise APIError(401, "missing or invalid cluster token (send Authorization: Bearer <token>)",
                           code="invalid_cluster_token")

    return guard(check)


def require_api_key(keys: tuple[str, ...]) -> Callable:
    """Dependency: one of the API keys, when any is configured."""

    def check(request: Request) -> None:
        if keys and not matches(bearer(request), keys):
            raise APIError(401, "missing or invalid API key (send Authorization: Bearer <key>)",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return guard(check)


def warn_if_open(host: str, token: str | None, what: str) -> None:
    """Log a warning when ``/internal/*`` would be open beyond this machine."""
    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        import logging

        logging.getLogger("warmpath").warning(
            "%s listens on %s without a cluster token: anyone who can reach it may call its "
            "/internal/* routes; set --cluster-token or WARMPATH_CLUSTER_TOKEN", what, host)

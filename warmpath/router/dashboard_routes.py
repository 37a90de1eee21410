"""The dashboard's HTTP routes on the router: the page and its data.

* ``GET /dashboard`` — one static page (``static/dashboard.html`` with its ``.js`` and
  ``.css`` under ``/dashboard/static/``), public: it holds no data, and nothing outside the
  cluster is loaded (no CDN; the charts are hand-drawn SVG).
* ``GET /v1/dashboard/state`` — what :class:`~warmpath.router.dashboard.Dashboard` keeps,
  under the same API-key rule as ``/v1/cluster``. It carries no URLs or PIDs; the page
  reads per-worker fields from ``/v1/cluster``, which redacts them for untrusted callers.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response

from warmpath.protocol.errors import APIError
from warmpath.protocol.openapi import errors, text
from warmpath.router.state import RouterState

STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}


def static_text(name: str) -> str:
    """A file of ``warmpath/router/static`` (package data)."""
    return files("warmpath.router").joinpath("static", name).read_text(encoding="utf-8")


def add_dashboard_routes(app: FastAPI, state: RouterState, public: list) -> None:
    """Register ``/dashboard``, its static files and ``/v1/dashboard/state``."""

    @app.get("/dashboard", response_class=Response, responses=text("text/html"))
    async def page() -> Response:
        return Response(static_text("dashboard.html"), media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/dashboard/static/{name}", response_class=Response,
             responses={**text(*STATIC.values()), **errors(404)})
    async def asset(name: str) -> Response:
        if name not in STATIC:
            raise APIError(404, f"no dashboard file {name!r}", err_type="not_found_error")
        return Response(static_text(name), media_type=STATIC[name] + "; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/v1/dashboard/state", dependencies=public, responses=errors(401))
    async def dashboard_state() -> dict:
        return state.dashboard.state(state)

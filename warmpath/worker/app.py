"""OpenAI-compatible HTTP API of one worker (FastAPI)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from warmpath.engine.async_engine import AsyncEngine
from warmpath.engine.llm_engine import LLMEngine
from warmpath.models.generation import check_override
from warmpath.models.tokenizer import ChatTemplateError
from warmpath.protocol.auth import require_api_key, require_cluster_token
from warmpath.protocol.errors import bad
from warmpath.protocol.http import DEFAULT_MAX_BODY_BYTES, JSONRoute, install_error_handlers
from warmpath.protocol.openai import ChatCompletionRequest, CompletionRequest, check_prompt_chars
from warmpath.protocol.openapi import ChatCompletion, TextCompletion, errors, generation, publish, status
from warmpath.worker.drain import Drain
from warmpath.worker.front import WorkerFront
from warmpath.worker.metrics import EngineMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    """HTTP front settings."""

    host: str = "127.0.0.1"
    port: int = 8000
    default_max_tokens: int = 1024       # max_tokens when neither the request nor the model sets it
    generation_override: dict = field(default_factory=dict)   # --override-generation-config (checked)
    disconnect_poll_s: float = 0.25
    registration: object | None = None   # worker.registration.RegistrationConfig when behind a router
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_waiting: int = 4096              # requests queued in the scheduler beyond which we answer 429
    exit_on_engine_failure: bool = True  # shut down (exit code 1) so a supervisor restarts the worker
    fault_injection: bool = False        # POST /internal/fault (tests and chaos runs only)
    cluster_token: str | None = field(default=None, repr=False)   # required on /internal/* (None: open)
    api_keys: tuple[str, ...] = field(default=(), repr=False)     # one required on /v1/* (none: open)
    drain_timeout_s: float = 120.0       # SIGTERM: how long the requests under way may take (worker/drain.py)
    warm_up: bool = True                 # LLMEngine.warm_up() in build_app: before it listens, registers, says ready

    def __post_init__(self) -> None:
        if self.max_waiting <= 0:
            raise ValueError(f"max_waiting must be > 0, got {self.max_waiting}")
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {self.max_body_bytes}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.default_max_tokens <= 0:
            raise ValueError(f"default_max_tokens must be > 0, got {self.default_max_tokens}")
        check_override(self.generation_override, "generation_override")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")


def _lifespan(app: FastAPI, aengine: AsyncEngine, cfg: ServerConfig):
    """The engine thread (and registration, heartbeats, the engine-death watch) live as
    long as the app."""

    async def on_engine_death() -> None:
        """The engine thread stopped: tell the router at once, then exit for a restart."""
        await aengine.dead.wait()
        detail = f"engine thread stopped: {aengine.error!r}"
        log.error("%s; reporting unhealthy%s", detail, " and exiting" if cfg.exit_on_engine_failure else "")
        if cfg.registration is not None:
            from warmpath.worker.registration import report_unhealthy

            await report_unhealthy(cfg.registration, detail)
        if cfg.exit_on_engine_failure:   # the CLI's uvicorn server, else a plain SIGTERM
            getattr(app.state, "request_exit", lambda: os.kill(os.getpid(), signal.SIGTERM))()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        aengine.start()
        tasks = [asyncio.create_task(on_engine_death())]
        if cfg.registration is not None:
            from warmpath.worker.registration import register_and_heartbeat

            drain = app.state.drain
            tasks.append(asyncio.create_task(register_and_heartbeat(
                cfg.registration, aengine.engine, lambda: aengine.alive and not drain.done,
                app.state.defaults.to_json(), lambda: drain.active)))
        yield
        for task in tasks:
            task.cancel()
        aengine.shutdown()

    return lifespan


def build_app(engine: LLMEngine, cfg: ServerConfig = ServerConfig()) -> FastAPI:
    """Create the app; the engine thread starts and stops with the app's lifespan. With
    ``cfg.warm_up`` the engine first does what a first request would wait for
    (``LLMEngine.warm_up``): the worker prints its address, listens, registers and answers
    ``/ready`` only after it (``app.state.warm_up``: the seconds it took)."""
    took = engine.warm_up() if cfg.warm_up else {}
    if took:
        log.info("warm-up before serving: %s", ", ".join(f"{k} {v:.2f} s" for k, v in took.items()))
    metrics = EngineMetrics(engine, engine.loaded.model_id)
    aengine = AsyncEngine(engine, on_step=metrics.on_step)
    front = WorkerFront(aengine, metrics, cfg)
    tok = engine.tokenizer
    app = FastAPI(title="warmpath")
    app.router.lifespan_context = _lifespan(app, aengine, cfg)
    app.router.route_class = JSONRoute
    publish(app)
    app.state.engine, app.state.aengine, app.state.metrics = engine, aengine, metrics
    app.state.warm_up = took
    app.state.defaults = front.defaults
    app.state.drain = Drain(cfg.drain_timeout_s)   # started by SIGTERM (worker/drain.py, via the CLI's server)
    app.state.max_body_bytes = cfg.max_body_bytes
    install_error_handlers(app, on_client_error=lambda _status: metrics.rejected.labels(front.model_name).inc())
    # Behind a router with no keys of its own, a worker's /v1/* needs the cluster token: the
    # router's API keys must not be bypassed by calling a worker directly.
    behind_router = cfg.registration is not None and cfg.cluster_token
    public = [Depends(require_api_key(cfg.api_keys or ((cfg.cluster_token,) if behind_router else ())))]
    internal = [Depends(require_cluster_token(cfg.cluster_token))]

    def chat_ids(body: ChatCompletionRequest) -> list[int]:
        try:
            text = tok.apply_chat_template(body.flat_messages(), add_generation_prompt=True)
        except ChatTemplateError as e:
            raise bad("messages", str(e)) from e
        return tok.encode(text, add_special=False)

    @app.post("/v1/chat/completions", dependencies=public, responses=generation(ChatCompletion, 429, 500, 503))
    async def chat(body: ChatCompletionRequest, req: Request) -> Response:
        if tok is None:
            raise bad("messages", "this model has no tokenizer; send token ids to /v1/completions")
        check_prompt_chars(body.prompt_chars(), engine.max_model_len, "messages")
        ids = await asyncio.to_thread(chat_ids, body)   # a long prompt must not stall the loop
        return await front.respond(req, front.admit(body, ids, "chat", "messages"))

    @app.post("/v1/completions", dependencies=public, responses=generation(TextCompletion, 429, 500, 503))
    async def completions(body: CompletionRequest, req: Request) -> Response:
        prompt = body.prompt
        if isinstance(prompt, str):
            if tok is None:
                raise bad("prompt", "this model has no tokenizer; send token ids")
            check_prompt_chars(len(prompt), engine.max_model_len, "prompt")
            prompt = await asyncio.to_thread(tok.encode, prompt)
        return await front.respond(req, front.admit(body, prompt, "text", "prompt"))

    _add_status_routes(app, front, public)
    from warmpath.worker.internal import add_fault_routes, add_internal_routes

    add_internal_routes(app, front, dependencies=internal)
    if cfg.fault_injection:
        add_fault_routes(app, aengine, dependencies=internal)
    return app


def _add_status_routes(app: FastAPI, front: WorkerFront, public: list) -> None:
    """``/v1/models``, ``/ready``, ``/health``, ``/metrics``."""
    engine, aengine, cfg = front.engine, front.aengine, front.cfg

    @app.get("/v1/models", dependencies=public, responses=errors(401))
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": front.model_name, "object": "model", "created": 0, "owned_by": "warmpath",
            "max_model_len": engine.max_model_len, "generation_defaults": front.defaults.to_json()}]}

    @app.get("/ready", responses=status(503))
    async def ready() -> Response:
        """Readiness: the engine runs, the worker is not draining, its waiting queue has room."""
        if app.state.drain.active:
            return JSONResponse({"status": "not ready", "detail": "draining"}, 503)
        if not aengine.alive:
            return JSONResponse({"status": "not ready", "detail": "engine thread stopped"}, 503)
        if len(engine.scheduler.waiting) >= cfg.max_waiting:
            return JSONResponse({"status": "not ready", "detail": "waiting queue full"}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/health", responses=status(503))
    async def health() -> Response:
        """Liveness: 503 once the engine thread stopped."""
        if not aengine.alive:
            return JSONResponse({"status": "error", "detail": "engine thread stopped"}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prom() -> Response:
        front.metrics.refresh()
        return PlainTextResponse(front.metrics.render(), media_type="text/plain; version=0.0.4")

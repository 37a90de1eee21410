"""The router process: OpenAI API in front of registered workers, cache-aware via KV events.

It tokenizes each request the way the workers do, hashes its blocks with the shared module,
looks the prefix up in the global index (fed by every worker's KV events), asks the routing
policy (and, for turn 2+, the PPD switch) where to run it, applies admission control
(429 + Retry-After), and runs it through the workers (``dispatch.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from warmpath.kv.events import KVEventSubscriber
from warmpath.kv.hashing import KVNamespace
from warmpath.models.tokenizer import TextTokenizer
from warmpath.router.admission import Admission, AdmissionConfig
from warmpath.router.dispatch import Dispatcher, Planner
from warmpath.router.flow import RequestFlow
from warmpath.router.handler import RequestHandler
from warmpath.router.index import GlobalKVIndex
from warmpath.router.metrics import RouterMetrics
from warmpath.router.policy import RoutingPolicy
from warmpath.router.ppd import PPDConfig, PPDTable
from warmpath.router.registry import DiscoveryConfig, Registry
from warmpath.router.sessions import SessionTable
from warmpath.router.state import RequestView
from warmpath.protocol.auth import bearer, matches, require_api_key, require_cluster_token
from warmpath.protocol.errors import APIError, bad
from warmpath.protocol.http import DEFAULT_MAX_BODY_BYTES, JSONRoute, install_error_handlers
from warmpath.protocol.internal import Heartbeat, Registration
from warmpath.protocol.openai import ChatCompletionRequest, CompletionRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    admission: AdmissionConfig = AdmissionConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    request_timeout_s: float = 600.0
    ppd: PPDConfig | None = None          # None: turn 2+ always goes through a prefill worker
    session_idle_s: float = 3600.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cluster_token: str | None = field(default=None, repr=False)   # /internal/*, to workers, KV events
    api_keys: tuple[str, ...] = field(default=(), repr=False)     # /v1/* (none: open)


class RouterState:
    """Everything the router knows; the HTTP handlers and the event threads share it."""

    def __init__(self, policy: RoutingPolicy, tokenizer: TextTokenizer, model_id: str, cfg: RouterConfig,
                 ppd_table: PPDTable | None = None):
        self.policy, self.tok, self.model_id, self.cfg = policy, tokenizer, model_id, cfg
        self.ppd_table = ppd_table or PPDTable()
        self.registry = Registry(cfg.discovery)
        self.index = GlobalKVIndex(stale_after_s=cfg.discovery.drop_after_s)
        self.sessions = SessionTable(cfg.session_idle_s)
        self.admission = Admission(cfg.admission)
        self.metrics = RouterMetrics()
        self.namespace: KVNamespace | None = None
        self.kv_bytes_per_token = 46080
        self.max_model_len: int | None = None     # learnt from the first registration
        self.lock = threading.Lock()
        self.subs: dict[str, tuple[KVEventSubscriber, threading.Event]] = {}
        self.routed: dict[str, int] = {}
        self.waiters: dict[int, asyncio.Event] = {}
        self.mid_stream_failures = 0
        self.pids: dict[str, int | None] = {}
        self.gone: dict[str, asyncio.Event] = {}

    def subscribe(self, worker: str, endpoint: str, replay: str) -> None:
        """Follow a worker's KV events (replacing the thread of an earlier registration)."""
        if worker in self.subs:
            self.subs.pop(worker)[1].set()
        stop = threading.Event()
        sub = KVEventSubscriber(endpoint, replay, token=self.cfg.cluster_token)

        def loop() -> None:
            while not stop.is_set():
                try:
                    batches = sub.poll(200)
                    with self.lock:
                        for _, events, _ in batches:
                            self.index.apply(worker, events, time.monotonic())
                except Exception:  # noqa: BLE001 - a malformed batch must not end the thread
                    log.exception("KV events of %s: batch skipped", worker)
                    self.metrics.thread_errors.labels("events").inc()
                    stop.wait(0.2)
            sub.close()

        threading.Thread(target=loop, daemon=True, name=f"events-{worker}").start()
        self.subs[worker] = (sub, stop)

    def remove(self, worker: str, reason: str) -> bool:
        """Stop routing to a worker (until it registers again); ``False`` if unknown."""
        if self.registry.workers.pop(worker, None) is None:
            return False
        self.drop(worker)
        self.metrics.dropped.labels(reason).inc()
        log.warning("dropped worker %s (%s)", worker, reason)
        return True

    def gone_event(self, worker: str) -> asyncio.Event:
        """Set when ``worker`` is dropped (requests waiting on it give up and retry)."""
        ev = self.gone.get(worker)
        if ev is None:
            ev = self.gone[worker] = asyncio.Event()
        return ev

    def drop(self, worker: str) -> None:
        """Forget a worker's index entries, sessions and event thread; wake the requests
        that wait on it (call on the event loop)."""
        self.gone_event(worker).set()
        with self.lock:
            self.index.drop_worker(worker)
        self.sessions.forget_worker(worker)
        if worker in self.subs:
            self.subs.pop(worker)[1].set()


def build_router(state: RouterState) -> FastAPI:
    """The router's app: the OpenAI API, the workers' registration and heartbeats, status."""
    token = state.cfg.cluster_token
    http = httpx.AsyncClient(timeout=httpx.Timeout(state.cfg.request_timeout_s, connect=5),
                             headers={"Authorization": f"Bearer {token}"} if token else None,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
    planner = Planner(state)
    handle = RequestHandler(state, RequestFlow(state, planner, Dispatcher(state, planner, http)))

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        task = asyncio.create_task(_expire_loop(state))
        yield
        task.cancel()
        for w in list(state.subs):
            state.drop(w)
        await http.aclose()

    app = FastAPI(title="warmpath router", lifespan=lifespan)
    app.router.route_class = JSONRoute
    app.state.max_body_bytes = state.cfg.max_body_bytes
    install_error_handlers(
        app, on_client_error=lambda status: state.metrics.client_errors.labels(str(status)).inc(),
        headers_for=lambda status: {"Retry-After": str(state.cfg.admission.retry_after_s)}
        if status == 429 else None)
    public = [Depends(require_api_key(state.cfg.api_keys))]

    @app.post("/v1/chat/completions", dependencies=public)
    async def chat(body: ChatCompletionRequest, req: Request) -> Response:
        return await handle(req, body)

    @app.post("/v1/completions", dependencies=public)
    async def completions(body: CompletionRequest, req: Request) -> Response:
        return await handle(req, body)

    @app.get("/v1/models", dependencies=public)
    async def models() -> dict:
        return {"object": "list", "data": [{"id": state.model_id, "object": "model", "owned_by": "warmpath"}]}

    _add_worker_routes(app, state, http, [Depends(require_cluster_token(token))])
    _add_status_routes(app, state, planner, public)
    return app


async def _expire_loop(state: RouterState) -> None:
    """Drop workers silent past ``drop_after_s`` and idle sessions, once a second."""
    while True:
        await asyncio.sleep(1.0)
        try:
            now = time.monotonic()
            for w in state.registry.expire(now):
                state.drop(w)
                state.metrics.dropped.labels("silent").inc()
            state.sessions.expire(now)
        except Exception:  # noqa: BLE001 - the loop that drops dead workers must not die
            log.exception("router expiry pass failed")
            state.metrics.thread_errors.labels("expire").inc()


def _add_worker_routes(app: FastAPI, state: RouterState, http: httpx.AsyncClient, internal: list) -> None:
    """``/internal/register`` and ``/internal/heartbeat`` (the cluster token required)."""

    async def answers(url: str) -> bool:
        try:
            return (await http.get(url + "/health", timeout=1.0)).status_code == 200
        except httpx.HTTPError:
            return False

    @app.post("/internal/register", dependencies=internal)
    async def register(b: Registration) -> dict:
        try:
            ns = KVNamespace(**b.namespace.model_dump())
        except (ValueError, TypeError) as e:
            raise bad("namespace", f"namespace: {e}") from e
        if state.namespace is None:
            state.namespace = ns
            state.kv_bytes_per_token = b.kv_bytes_per_token
            state.max_model_len = b.max_model_len
        elif ns != state.namespace:
            raise bad("namespace", f"worker {b.worker_id} serves a different model/KV layout")
        old = state.registry.workers.get(b.worker_id)
        if old is not None and (old.url == b.url and state.pids.get(b.worker_id) != b.pid
                                or old.url != b.url and not await answers(old.url)):
            state.remove(b.worker_id, "replaced")   # a restart of a worker that died silently
        try:
            state.registry.register(b.worker_id, b.role, b.url, time.monotonic(),
                                    b.events_endpoint, b.replay_endpoint)
        except ValueError as e:
            raise APIError(409, str(e), param="worker_id") from e
        if state.gone.get(b.worker_id) is None or state.gone[b.worker_id].is_set():
            state.gone[b.worker_id] = asyncio.Event()   # a fresh life: nothing waits on it yet
        if b.events_endpoint:
            state.subscribe(b.worker_id, b.events_endpoint, b.replay_endpoint or b.events_endpoint)
        state.pids[b.worker_id] = b.pid
        return {"ok": True}

    @app.post("/internal/heartbeat", dependencies=internal)
    async def heartbeat(b: Heartbeat) -> Response:
        if not b.healthy:   # its engine failed: stop routing to it now, not after drop_after_s
            state.remove(b.worker_id, "unhealthy")
            return JSONResponse({"ok": True})
        if not state.registry.heartbeat(b.worker_id, time.monotonic(), **b.load()):
            raise APIError(404, f"unknown worker {b.worker_id!r}: register first", param="worker_id")
        return JSONResponse({"ok": True})


def _add_status_routes(app: FastAPI, state: RouterState, planner: Planner, public: list) -> None:
    """``/health``, ``/ready``, ``/metrics`` and ``/v1/cluster``."""
    token = state.cfg.cluster_token

    @app.get("/health")
    async def health() -> dict:
        """Liveness: the router process answers."""
        return {"status": "ok", "workers": len(state.registry.workers)}

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 503 until the policy finds a complete path (prefill + decode, or a replica)."""
        probe = RequestView(1, (), 16)
        try:
            d = state.policy.route(probe, planner.snapshot(probe, None))
        except LookupError as e:
            return JSONResponse({"status": "not ready", "detail": str(e)}, status_code=503)
        return JSONResponse({"status": "ready", "workers": len(state.registry.workers),
                             "path": [w for w in (d.prefill, d.decode) if w]})

    @app.get("/metrics")
    async def prom() -> Response:
        return Response(state.metrics.render(state.admission.in_flight, state.admission.waiting()),
                        media_type="text/plain; version=0.0.4")

    def trusted(req: Request) -> bool:
        """May this request see PIDs and internal URLs? (An API key; without API keys, the
        cluster token; with neither configured, anyone.)"""
        keys = state.cfg.api_keys or ((token,) if token else ())
        return not keys or matches(bearer(req), keys)

    @app.get("/v1/cluster", dependencies=public)
    async def cluster(req: Request) -> dict:
        full = trusted(req)

        def worker(w: str, r) -> dict:
            load = planner.load.get(w, [0, 0])
            out = {**vars(r.view), "url": r.url, "pid": state.pids.get(w), "routed": state.routed.get(w, 0),
                   "router_queued_prefill_tokens": load[0], "router_running": load[1],
                   "indexed_blocks": len(state.index.local.get(w, {}))}
            if not full:
                del out["url"], out["pid"]
            return out
        m = state.metrics
        return {"policy": state.policy.name, "ppd": state.cfg.ppd.mode if state.cfg.ppd else None,
                "workers": [worker(w, r) for w, r in state.registry.workers.items()],
                "sessions": len(state.sessions.sessions), "retries": int(m.retries._value.get()),
                "mid_stream_failures": state.mid_stream_failures,
                "ppd_decisions": {p: int(m.ppd.labels(p)._value.get()) for p in ("local", "remote")},
                "kv_handoff_bytes": int(m.kv_bytes._value.get()), "latency": m.summary(),
                "admission": {"in_flight": state.admission.in_flight, "waiting": state.admission.waiting(),
                              "rejected": state.admission.rejected}}

"""The router process: OpenAI API in front of registered workers, cache-aware via KV events.

It tokenizes each request the way the workers do, hashes its blocks with the shared module,
looks the prefix up in the global index (fed by every worker's KV events), decides its
route (``route.py``: the routing policy, the PPD switch for turn 2+), applies admission control
(429 + Retry-After), and runs it through the workers (``flow.py``; HTTP in ``dispatch.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from warmpath.protocol.auth import bearer, matches, require_api_key, require_cluster_token
from warmpath.protocol.errors import APIError
from warmpath.protocol.http import JSONRoute, install_error_handlers
from warmpath.protocol.internal import Drain, DrainState, Heartbeat, HeldQuery, HeldReply, Registration
from warmpath.protocol.openai import ChatCompletionRequest, CompletionRequest
from warmpath.protocol.openapi import BODY, ChatCompletion, TextCompletion, errors, generation, publish, status
from warmpath.router.dashboard_routes import add_dashboard_routes
from warmpath.router.dispatch import WorkerClient
from warmpath.routing.elastic import elastic_json
from warmpath.router.flow import RequestFlow
from warmpath.router.handler import RequestHandler
from warmpath.router.registrar import registrar
from warmpath.router.peers import add_peer_routes, adopt_peer_workers, peer_loop, routers_json
from warmpath.router.state import RouterState
from warmpath.routing.views import RequestView

log = logging.getLogger(__name__)


def build_router(state: RouterState) -> FastAPI:
    """The router's app: the OpenAI API, the workers' registration and heartbeats, status."""
    token = state.cfg.cluster_token
    http = httpx.AsyncClient(timeout=httpx.Timeout(state.cfg.request_timeout_s, connect=5),
                             headers={"Authorization": f"Bearer {token}"} if token else None,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
    client = WorkerClient(http, lambda w: (r := state.registry.workers.get(w)) and r.url, state.gone_event)
    handle = RequestHandler(state, RequestFlow(state, client))

    internal = [Depends(require_cluster_token(token))]
    register = registrar(state, http)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        tasks = [asyncio.create_task(_expire_loop(state))]
        if state.cfg.peers.peers:   # active-active: follow the peers' workers now, then report every every_s
            await adopt_peer_workers(state, http, register)
            tasks.append(asyncio.create_task(peer_loop(state, http)))
        yield
        for task in tasks:
            task.cancel()
        for w in list(state.subs):
            state.drop(w)
        await http.aclose()

    app = FastAPI(title="warmpath router", lifespan=lifespan)
    app.router.route_class = JSONRoute
    publish(app)
    app.state.max_body_bytes = state.cfg.max_body_bytes
    install_error_handlers(
        app, on_client_error=lambda status: state.metrics.client_errors.labels(str(status)).inc(),
        headers_for=lambda status: {"Retry-After": str(state.cfg.admission.retry_after_s)}
        if status == 429 else None)
    public = [Depends(require_api_key(state.cfg.api_keys))]

    failed = (429, 500, 502, 503)   # 500: a worker's engine failed the request alone (relayed)

    @app.post("/v1/chat/completions", dependencies=public, responses=generation(ChatCompletion, *failed))
    async def chat(body: ChatCompletionRequest, req: Request) -> Response:
        return await handle(req, body)

    @app.post("/v1/completions", dependencies=public, responses=generation(TextCompletion, *failed))
    async def completions(body: CompletionRequest, req: Request) -> Response:
        return await handle(req, body)

    @app.get("/v1/models", dependencies=public, responses=errors(401))
    async def models() -> dict:
        entry = {"id": state.model_id, "object": "model", "owned_by": "warmpath"}
        if state.namespace is not None:   # what the first worker to register reported
            entry.update(max_model_len=state.max_model_len, generation_defaults=state.generation_defaults)
        return {"object": "list", "data": [entry]}

    _add_worker_routes(app, state, register, internal)
    add_peer_routes(app, state, internal)
    _add_index_routes(app, state, internal)

    @app.post("/internal/decide", dependencies=internal, responses=errors(*BODY, 503))
    async def decide(body: CompletionRequest, req: Request) -> dict:
        """Where this completion request would go now (not sent; nothing counted)."""
        d = await handle.would_route(req, body)
        return {"path": d.path, "cls": d.cls, "prefill": d.prefill, "decode": d.decode,
                "est_ttft_s": d.est_ttft_s, "cached_tokens": d.cached_tokens, "reason": d.reason}
    _add_status_routes(app, state, public)
    add_dashboard_routes(app, state, public)
    return app


async def _expire_loop(state: RouterState) -> None:
    """Drop workers silent past ``drop_after_s`` (checked every ``check_every_s``); once a
    second: idle sessions, the CPD tiers' rebalance (elastic), the dashboard's sample."""
    tick = state.cfg.discovery.check_every_s
    last_pass = 0.0
    while True:
        await asyncio.sleep(tick)
        try:
            now = time.monotonic()
            for w in state.registry.expire(now):
                state.drop(w)
                state.metrics.dropped.labels("silent").inc()
            if now - last_pass < 1.0 - tick / 2:
                continue
            last_pass = now
            state.sessions.expire(now)
            state.rebalance(now)
            state.dashboard.sample(state, now)
        except Exception:  # noqa: BLE001 - the loop that drops dead workers must not die
            log.exception("router expiry pass failed")
            state.metrics.thread_errors.labels("expire").inc()


def _add_worker_routes(app: FastAPI, state: RouterState, registrar, internal: list) -> None:
    """``/internal/register``, ``/internal/heartbeat`` and ``/internal/drain`` (the cluster
    token required)."""

    @app.post("/internal/register", dependencies=internal, responses=errors(*BODY, 409))
    async def register(b: Registration) -> dict:
        await registrar(b)
        return {"ok": True}

    @app.post("/internal/heartbeat", dependencies=internal, responses=errors(*BODY, 404))
    async def heartbeat(b: Heartbeat) -> Response:
        if not b.healthy:   # its engine failed (or it drained): stop routing to it now, not after drop_after_s
            state.remove(b.worker_id, "drained" if b.draining else "unhealthy")
            return JSONResponse({"ok": True})
        if not state.registry.heartbeat(b.worker_id, time.monotonic(), **b.load()):
            raise APIError(404, f"unknown worker {b.worker_id!r}: register first", param="worker_id")
        role = state.registry.workers[b.worker_id].view.role   # elastic roles may have moved it
        if b.role is not None and b.role != role and not state.decides_roles(time.monotonic()):
            # roles are not this router's to decide (another router leads): the worker says which it serves now
            state.registry.set_role(b.worker_id, b.role)
            state.fit_admission()
            role = b.role
        if not b.draining:
            return JSONResponse({"ok": True, "role": role})
        if b.worker_id not in state.draining:   # it got SIGTERM (worker/drain.py): nothing new for it
            state.drain(b.worker_id, "drain")
        # what it must still wait for: its requests here, and prefills elsewhere whose decode goes to it
        return JSONResponse({"ok": True, "role": role, "in_flight": state.load.in_flight(b.worker_id)})

    @app.post("/internal/drain", dependencies=internal, responses=errors(*BODY, 404))
    async def drain(b: Drain) -> DrainState:
        """Stop routing to a worker before it is stopped (scale-down): poll until
        ``in_flight`` is 0, stop it, then ``remove`` it."""
        if not state.drain(b.worker_id, b.action) and b.action != "resume":
            raise APIError(404, f"unknown worker {b.worker_id!r}", param="worker_id")
        return DrainState(worker_id=b.worker_id, registered=b.worker_id in state.registry.workers,
                          draining=b.worker_id in state.draining, in_flight=state.load.in_flight(b.worker_id))


def _add_index_routes(app: FastAPI, state: RouterState, internal: list) -> None:
    """``/internal/kv/held``: what the router's KV index holds for a worker (the cluster token required)."""

    @app.post("/internal/kv/held", dependencies=internal, responses=errors(*BODY, 404))
    async def held(b: HeldQuery) -> HeldReply:
        """Which of ``keys`` the index holds for a worker: index fidelity (``vllm/fidelity.py``)
        asks with the blocks a vLLM worker's events say are cached, so the index stays here."""
        keys = [bytes.fromhex(k) for k in b.keys]
        with state.lock:
            idx = state.index
            if b.worker_id not in idx.local and b.worker_id not in state.registry.workers:
                raise APIError(404, f"unknown worker {b.worker_id!r}", param="worker_id")
            gaps, split = idx.missing(b.worker_id, keys)
            indexed, stale = len(idx.local.get(b.worker_id, {})), idx.is_stale(b.worker_id, time.monotonic())
        return HeldReply(worker_id=b.worker_id, asked=len(keys), held=len(keys) - len(gaps), missing=gaps,
                         indexed=indexed, stale=stale, mirror_mismatch=split)


def _add_status_routes(app: FastAPI, state: RouterState, public: list) -> None:
    """``/health``, ``/ready``, ``/metrics`` and ``/v1/cluster``."""
    token = state.cfg.cluster_token

    @app.get("/health", responses=status())
    async def health() -> dict:
        """Liveness: the router process answers."""
        return {"status": "ok", "workers": len(state.registry.workers)}

    @app.get("/ready", responses=status(503))
    async def ready() -> Response:
        """Readiness: 503 until the policy finds a complete path (prefill + decode, or a replica)
        and the KV snapshots of the workers registered are read."""
        if state.reading:   # a router that just started: its index is not whole yet
            return JSONResponse({"status": "not ready", "detail": f"reading the KV blocks of {len(state.reading)} "
                                 "worker(s)"}, status_code=503)
        probe = RequestView(1, (), 16, max_tokens=1)   # a one-token probe: is there any path
        try:
            d = state.decider.decide_route(probe, state.snapshot(probe, None), arrival=False)
        except LookupError as e:
            return JSONResponse({"status": "not ready", "detail": str(e)}, status_code=503)
        return JSONResponse({"status": "ready", "workers": len(state.registry.workers),
                             "path": [w for w in (d.prefill, d.decode) if w]})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prom() -> Response:
        with state.lock:
            sizes = state.index.sizes()
        text = state.metrics.render(state.admission.in_flight, state.admission.waiting(),
                                    len(state.sessions.sessions), sizes)
        return Response(text, media_type="text/plain; version=0.0.4")

    def trusted(req: Request) -> bool:
        """May this request see PIDs and internal URLs? (An API key; without API keys, the
        cluster token; with neither configured, anyone.)"""
        keys = state.cfg.api_keys or ((token,) if token else ())
        return not keys or matches(bearer(req), keys)

    @app.get("/v1/cluster", dependencies=public, responses=errors(401))
    async def cluster(req: Request) -> dict:
        full = trusted(req)

        def worker(w: str, r) -> dict:
            load = state.load.of(w)
            out = {**vars(r.view), "url": r.url, "pid": state.pids.get(w), "routed": state.routed.get(w, 0),
                   "router_queued_prefill_tokens": load.prefill_tokens, "router_running": load.running,
                   "indexed_blocks": len(state.index.local.get(w, {})),
                   "draining": w in state.draining, "in_flight": state.load.in_flight(w)}
            out["engine"] = state.namespaces.engine_of(w)
            ns = state.namespaces.of.get(w)
            if ns is not None:   # a fleet of two engines: each worker's KV namespace (routing/namespaces.py)
                out["kv_namespace"] = {"revision": ns.revision, "dtype": ns.dtype, "block_size": ns.block_size}
            believed = state.decider.model.of(r.view)    # what the router's learnt model uses now
            out.update(model_prefill_tok_s=round(believed.compute.bytes_s, 1),
                       model_l3_read_bytes_s=round(believed.l3_read.bytes_s),
                       model_l3_write_bytes_s=round(believed.l3_write.bytes_s))
            if not full:
                del out["url"], out["pid"]
            return out
        m = state.metrics
        return {"policy": state.policy.name, "ppd": state.cfg.ppd.mode if state.cfg.ppd else None,
                "model": state.decider.model.params(),
                "elastic": elastic_json(state.decider.elastic),
                "workers": [worker(w, r) for w, r in state.registry.workers.items()],
                "sessions": len(state.sessions.sessions), "retries": int(m.retries._value.get()),
                "mid_stream_failures": state.mid_stream_failures,
                "ppd_decisions": {p: int(m.ppd.labels(p)._value.get()) for p in ("local", "remote")},
                "decisions": list(state.dashboard.decisions)[-20:],   # predicted vs measured, newest last
                "kv_handoff_bytes": int(m.kv_bytes._value.get()), "latency": m.summary(),
                "admission": state.admission.to_json(), **routers_json(state, time.monotonic(), full)}

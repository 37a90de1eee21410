"""The router process: OpenAI API in front of registered workers, cache-aware via KV events.

It tokenizes each request the way the workers do, hashes its blocks with the shared module,
looks the prefix up in the global index (fed by every worker's KV events), asks the routing
policy for a worker, applies admission control (429 + Retry-After), and proxies the request.
This front serves topologies whose workers each run prefill and decode (``replica``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from warmpath.kv.events import KVEventSubscriber
from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks
from warmpath.models.tokenizer import ChatTemplateError, TextTokenizer
from warmpath.router.admission import Admission, AdmissionConfig
from warmpath.router.index import GlobalKVIndex
from warmpath.router.policy import RoutingPolicy
from warmpath.router.registry import DiscoveryConfig, Registry
from warmpath.router.sessions import SessionTable, session_id
from warmpath.router.state import RequestView, Snapshot
from warmpath.server.protocol import APIError, bad, parse_common, parse_messages, parse_prompt


class WorkerUnreachable(Exception):
    """The chosen worker refused the connection (nothing was sent to the client yet)."""


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    admission: AdmissionConfig = AdmissionConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    request_timeout_s: float = 600.0


class RouterState:
    """Everything the router knows; the HTTP handlers and the event threads share it."""

    def __init__(self, policy: RoutingPolicy, tokenizer: TextTokenizer, model_id: str, cfg: RouterConfig):
        self.policy, self.tok, self.model_id, self.cfg = policy, tokenizer, model_id, cfg
        self.registry = Registry(cfg.discovery)
        self.index = GlobalKVIndex(stale_after_s=cfg.discovery.drop_after_s)
        self.sessions = SessionTable()
        self.admission = Admission(cfg.admission)
        self.namespace: KVNamespace | None = None
        self.lock = threading.Lock()
        self.subs: dict[str, tuple[KVEventSubscriber, threading.Event]] = {}
        self.routed: dict[str, int] = {}
        self.waiters: dict[int, asyncio.Event] = {}
        self.retries = 0
        self.mid_stream_failures = 0

    def subscribe(self, worker: str, endpoint: str, replay: str) -> None:
        stop = threading.Event()
        sub = KVEventSubscriber(endpoint, replay)

        def loop() -> None:
            while not stop.is_set():
                batches = sub.poll(200)
                with self.lock:
                    for _, events, _ in batches:
                        self.index.apply(worker, events, time.monotonic())
            sub.close()

        threading.Thread(target=loop, daemon=True, name=f"events-{worker}").start()
        self.subs[worker] = (sub, stop)

    def drop(self, worker: str) -> None:
        with self.lock:
            self.index.drop_worker(worker)
        self.sessions.forget_worker(worker)
        if worker in self.subs:
            self.subs.pop(worker)[1].set()


def build_router(state: RouterState) -> FastAPI:
    http = httpx.AsyncClient(timeout=httpx.Timeout(state.cfg.request_timeout_s, connect=5))

    async def expire_loop() -> None:
        while True:
            await asyncio.sleep(1.0)
            for w in state.registry.expire(time.monotonic()):
                state.drop(w)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        task = asyncio.create_task(expire_loop())
        yield
        task.cancel()
        for w in list(state.subs):
            state.drop(w)
        await http.aclose()

    app = FastAPI(title="warmpath router", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(_req: Request, e: APIError) -> JSONResponse:
        headers = {"Retry-After": str(state.cfg.admission.retry_after_s)} if e.status == 429 else None
        return JSONResponse(e.body(), status_code=e.status, headers=headers)

    @app.post("/internal/register")
    async def register(req: Request) -> dict:
        b = await req.json()
        ns = KVNamespace(**b["namespace"])
        if state.namespace is None:
            state.namespace = ns
        elif ns != state.namespace:
            raise bad("namespace", f"worker {b['worker_id']} serves a different model/KV layout")
        try:
            state.registry.register(b["worker_id"], b["role"], b["url"], time.monotonic(),
                                    b.get("events_endpoint"), b.get("replay_endpoint"))
        except ValueError as e:
            raise bad("worker_id", str(e)) from e
        if b.get("events_endpoint"):
            state.subscribe(b["worker_id"], b["events_endpoint"], b["replay_endpoint"])
        return {"ok": True}

    @app.post("/internal/heartbeat")
    async def heartbeat(req: Request) -> Response:
        b = await req.json()
        wid = b.pop("worker_id")
        if not state.registry.heartbeat(wid, time.monotonic(), **b):
            return JSONResponse({"error": "unknown worker"}, status_code=404)
        return JSONResponse({"ok": True})

    async def handle(req: Request, path: str) -> Response:
        try:
            body = json.loads(await req.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad("body", f"malformed JSON body: {e}") from e
        parsed = parse_common(body)
        if parsed.model is not None and parsed.model != state.model_id:
            raise APIError(400, f"model {parsed.model!r} does not exist; available: {state.model_id!r}",
                           param="model", code="model_not_found")
        msgs = None
        if path == "chat/completions":
            msgs = parse_messages(body)
            try:
                ids = state.tok.encode(state.tok.apply_chat_template(msgs), add_special=False)
            except ChatTemplateError as e:
                raise bad("messages", str(e)) from e
        else:
            p = parse_prompt(body)
            ids = state.tok.encode(p) if isinstance(p, str) else p
        if state.namespace is None or not state.registry.workers:
            raise APIError(503, "no worker registered yet", err_type="server_error")
        ns = state.namespace.with_salt(parsed.cache_salt)
        hashes = tuple(hash_prefix_blocks(ns, ids))
        now = time.monotonic()
        sid = session_id(parsed.user, req.headers.get("x-session-id"), msgs)
        sess = state.sessions.touch(sid, now) if sid else None
        rv = RequestView(len(ids), hashes, ns.block_size, sid, max_tokens=parsed.max_tokens or 128)
        decision = decide(rv, sess)
        key = id(req)
        verdict = state.admission.offer(key, decision.tier if decision.tier in ("cold", "warm") else
                                        ("warm" if decision.cached_tokens else "cold"))
        if verdict == "rejected":
            raise APIError(429, "too many requests in flight; retry later", err_type="rate_limit_error")
        if verdict == "queued":
            ev = state.waiters[key] = asyncio.Event()
            try:
                await ev.wait()
            except asyncio.CancelledError:  # the client left while waiting
                state.waiters.pop(key, None)
                if not state.admission.cancel(key):
                    finish()  # we had already been given the slot: hand it on
                raise
        if sess is not None:
            sess.turns += 1
        for attempt in range(2):
            with state.lock:
                state.index.note_routed(decision.prefill, hashes, time.monotonic())
            if sess is not None:
                sess.decode_worker = decision.decode
            state.routed[decision.prefill] = state.routed.get(decision.prefill, 0) + 1
            url = state.registry.workers[decision.prefill].url + "/v1/" + path
            try:
                return await forward(url, body, parsed.stream, decision.prefill)
            except WorkerUnreachable:
                # Nothing reached the client yet: forget the worker and route again once.
                state.registry.workers.pop(decision.prefill, None)
                state.drop(decision.prefill)
                state.retries += 1
                try:
                    if attempt == 1:
                        raise LookupError(f"worker {decision.prefill} unreachable")
                    decision = decide(rv, sess)
                except (LookupError, APIError) as e:
                    finish()
                    raise APIError(503, f"no worker could take the request: {e}", err_type="server_error") from e
        raise AssertionError("unreachable")

    def decide(rv: RequestView, sess):
        now = time.monotonic()
        with state.lock:
            views = state.registry.views()
            hits = {w.worker_id: state.index.lookup(w.worker_id, rv.block_hashes, now) for w in views}
        try:
            return state.policy.route(rv, Snapshot(views, hits, sess.decode_worker if sess else None))
        except LookupError as e:
            raise APIError(503, str(e), err_type="server_error") from e

    def finish() -> None:
        nxt = state.admission.release()
        if nxt is not None and nxt in state.waiters:
            state.waiters.pop(nxt).set()

    async def forward(url: str, body: dict, stream: bool, worker: str) -> Response:
        headers = {"X-Warmpath-Worker": worker}
        if not stream:
            try:
                r = await http.post(url, json=body)
            except httpx.ConnectError as e:
                raise WorkerUnreachable(worker) from e
            except httpx.HTTPError as e:
                finish()
                raise APIError(502, f"worker {worker} failed: {e}", err_type="server_error") from e
            finish()
            return Response(r.content, status_code=r.status_code, media_type="application/json",
                            headers=headers)
        try:
            upstream = await http.send(http.build_request("POST", url, json=body), stream=True)
        except httpx.ConnectError as e:
            raise WorkerUnreachable(worker) from e
        except httpx.HTTPError as e:
            finish()
            raise APIError(502, f"worker {worker} failed: {e}", err_type="server_error") from e

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError as e:
                # The worker died mid-stream: tokens already went out, so no retry; end the
                # stream with an OpenAI-shaped error event the client can read.
                state.mid_stream_failures += 1
                err = APIError(502, f"worker {worker} failed mid-stream: {type(e).__name__}",
                               err_type="server_error")
                yield f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
            finally:
                await upstream.aclose()
                finish()

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 media_type="text/event-stream", headers=headers)

    @app.post("/v1/chat/completions")
    async def chat(req: Request) -> Response:
        return await handle(req, "chat/completions")

    @app.post("/v1/completions")
    async def completions(req: Request) -> Response:
        return await handle(req, "completions")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": state.model_id, "object": "model", "owned_by": "warmpath"}]}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "workers": len(state.registry.workers)}

    @app.get("/v1/cluster")
    async def cluster() -> dict:
        return {"policy": state.policy.name,
                "workers": [{**vars(r.view), "url": r.url, "routed": state.routed.get(w, 0),
                             "indexed_blocks": len(state.index.local.get(w, {}))}
                            for w, r in state.registry.workers.items()],
                "sessions": len(state.sessions.sessions), "retries": state.retries,
                "mid_stream_failures": state.mid_stream_failures,
                "admission": {"in_flight": state.admission.in_flight, "waiting": state.admission.waiting(),
                              "rejected": state.admission.rejected}}

    return app

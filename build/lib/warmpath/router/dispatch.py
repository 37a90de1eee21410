"""One request's trip through the cluster: plan, prefill (+ handoff), decode, relay.

* Disaggregated (``cpd``, ``pd``): the prefill worker runs the prompt to its first token and
  writes the prompt's blocks through to L3; the decode worker gets (prompt, first token),
  reports the token at once, loads the blocks and generates the rest.
* PPD local (turn 2+): the session's decode worker runs the append-prefill itself.
* ``replica``: one worker does both.

Failures before the client saw a token are retried once elsewhere; after that the stream
ends with an OpenAI-shaped error event.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace

import httpx

from pydantic import ValidationError

from warmpath.protocol.internal import GenerateRequest, PrefillReply, PrefillRequest
from warmpath.protocol.openai import SamplingFields
from warmpath.router import ppd
from warmpath.router.state import Decision, RequestView, Snapshot

RETRYABLE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)


class WorkerUnreachable(Exception):
    """The worker failed before anything reached the client (safe to retry elsewhere)."""


class UpstreamError(Exception):
    """A worker answered with an error status; relay it as is."""

    def __init__(self, status: int, content: bytes) -> None:
        super().__init__(status)
        self.status, self.content = status, content


def _engine_failed(status: int, content: bytes) -> bool:
    """A worker whose engine stopped answers 503 ``engine_failed``: nothing was computed for
    the request, so it may go to another worker."""
    return status == 503 and b'"engine_failed"' in content


@dataclass
class Trip:
    """What the router learns about one request on its way."""

    rv: RequestView
    ids: list[int]
    body: SamplingFields          # the client's validated request
    kind: str                     # "chat" | "text"
    cls: str                      # "cold" | "warm"
    arrival: float
    admitted: float = 0.0
    decision: Decision | None = None
    first_token: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    queue_s: float = 0.0
    completion_tokens: int = 0
    first_token_at: float | None = None
    timing: dict[str, float] = field(default_factory=dict)   # seconds per stage (Server-Timing)

    def server_timing(self) -> str:
        """The ``Server-Timing`` header value (milliseconds per stage, as the spec has it)."""
        return ", ".join(f"{k};dur={v * 1000:.1f}" for k, v in self.timing.items())


class Planner:
    """Builds snapshots (router-tracked load over heartbeat speeds) and asks the policies."""

    def __init__(self, state) -> None:
        self.s = state
        self.load: dict[str, list[int]] = {}       # worker -> [queued prefill tokens, running]

    def add(self, worker: str, prefill_tokens: int = 0, running: int = 0) -> None:
        x = self.load.setdefault(worker, [0, 0])
        x[0] = max(0, x[0] + prefill_tokens)
        x[1] = max(0, x[1] + running)

    def snapshot(self, rv: RequestView, session) -> Snapshot:
        s, now = self.s, time.monotonic()
        with s.lock:
            views = [replace(v, queued_prefill_tokens=self.load.get(v.worker_id, [0, 0])[0],
                             running=self.load.get(v.worker_id, [0, 0])[1]) for v in s.registry.views()]
            hits = {w.worker_id: s.index.lookup(w.worker_id, rv.block_hashes, now) for w in views}
        return Snapshot(views, hits, session.decode_worker if session else None,
                        kv_bytes_per_token=s.kv_bytes_per_token)

    def plan(self, rv: RequestView, session, allow_local: bool = True) -> Decision:
        """Routing decision; PPD may turn a turn-2+ request into a local append-prefill
        (``Decision.ppd`` says which way the PPD switch went; the caller counts it once)."""
        snap = self.snapshot(rv, session)
        d = self.s.policy.route(rv, snap)          # LookupError when nobody can take it
        cfg = self.s.cfg.ppd
        if (d.prefill == d.decode or rv.turn < 2 or cfg is None or session is None
                or d.decode != session.decode_worker):
            return d
        views = {w.worker_id: w for w in snap.workers}
        dw, pw = views[d.decode], views[d.prefill]
        choice = ppd.decide(cfg, self.s.ppd_table, rv, dw, pw.queued_prefill_tokens / pw.prefill_tok_s)
        if not (choice.local and allow_local):
            return replace(d, ppd="remote")
        hit = snap.hits.get(dw.worker_id)
        cached = min(rv.num_tokens - 1, hit.local_blocks * rv.block_size) if hit else 0
        return Decision(None, dw.worker_id, "local", 0.0, cached, choice.reason, ppd="local")


class Dispatcher:
    """Runs a planned request against the workers (HTTP), with retries and accounting."""

    def __init__(self, state, planner: Planner, http: httpx.AsyncClient) -> None:
        self.s, self.p, self.http = state, planner, http

    def _url(self, worker: str, path: str) -> str:
        rec = self.s.registry.workers.get(worker)
        if rec is None:
            raise WorkerUnreachable(worker)
        return rec.url + path

    async def _unless_lost(self, worker: str, aw):
        """Await ``aw`` unless ``worker`` is dropped first (no heartbeat, unhealthy): then
        :class:`WorkerUnreachable`, so a request stuck on a host that vanished (a cut link
        leaves a kept-alive connection silent) is retried elsewhere instead of waiting for
        the request timeout."""
        gone = self.s.gone_event(worker)
        task = asyncio.ensure_future(aw)
        waiter = asyncio.ensure_future(gone.wait())
        try:
            done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task in done:
            return task.result()
        task.cancel()
        raise WorkerUnreachable(worker)

    def lost(self, worker: str) -> None:
        """A worker failed: stop routing to it until it registers again."""
        self.s.remove(worker, "unreachable")
        self.s.metrics.retries.inc()

    async def prefill(self, t: Trip, worker: str) -> dict:
        """Prompt → first token on a prefill worker; its blocks land in L3 (the handoff)."""
        d = t.decision
        self.p.add(worker, t.rv.num_tokens - d.cached_tokens)
        sent = time.monotonic()
        try:
            msg = PrefillRequest(prompt_token_ids=t.ids, request=t.body.forwarded())
            r = await self._unless_lost(worker, self.http.post(self._url(worker, "/internal/prefill"),
                                                               json=msg.model_dump()))
        except RETRYABLE as e:
            raise WorkerUnreachable(worker) from e
        finally:
            self.p.add(worker, -(t.rv.num_tokens - d.cached_tokens))
        if _engine_failed(r.status_code, r.content):
            raise WorkerUnreachable(worker)
        if r.status_code != 200:
            raise UpstreamError(r.status_code, r.content)
        try:
            out = PrefillReply.model_validate_json(r.content)
        except ValidationError as e:
            raise UpstreamError(502, _bad_gateway(worker, e)) from e
        m = self.s.metrics
        m.kv_bytes.inc(out.kv_bytes)
        m.kv_put_s.inc(out.l3_put_s)
        t.first_token, t.cached_tokens = out.token, out.cached_tokens
        t.first_token_at = time.monotonic()
        t.timing["prefill"], t.timing["prefill_worker"] = t.first_token_at - sent, out.prefill_s
        t.timing.update(prefill_queue=out.queue_s, prefill_l3_get=out.l3_get_s, prefill_l3_put=out.l3_put_s)
        t.ttft_s = t.first_token_at - t.arrival
        t.queue_s = (t.admitted - t.arrival) + out.queue_s
        m.first_token(t.cls, t.ttft_s, t.queue_s)
        return out

    def _payload(self, t: Trip) -> dict:
        req = t.body.forwarded()
        if t.body.stream:   # the usage chunk tells the router how many tokens went out
            req["stream_options"] = {"include_usage": True}
        return GenerateRequest(kind=t.kind, prompt_token_ids=t.ids, request=req, first_token=t.first_token,
                               cached_tokens=t.cached_tokens).model_dump(exclude_none=True)

    def _got_first(self, t: Trip) -> None:
        if t.ttft_s is None:
            t.first_token_at = time.monotonic()
            t.ttft_s = t.first_token_at - t.arrival
            t.queue_s = t.admitted - t.arrival
            self.s.metrics.first_token(t.cls, t.ttft_s, t.queue_s)

    def finished(self, t: Trip) -> None:
        """Record TPOT once the last token went out."""
        n = t.completion_tokens
        if n > 1 and t.first_token_at is not None:
            self.s.metrics.tpot.labels(t.cls).observe((time.monotonic() - t.first_token_at) / (n - 1))

    async def generate(self, t: Trip, worker: str):
        """Non-streaming: the response body. Streaming: ``(first lines, line iterator,
        upstream)``; the first lines already hold a token, so a failure before them is
        retryable (raised as :class:`WorkerUnreachable`)."""
        local = t.first_token is None
        computed = t.rv.num_tokens - (t.decision.cached_tokens if local else t.rv.num_tokens)
        self.p.add(worker, computed, 0)
        sent = time.monotonic()
        try:
            if not t.body.stream:
                try:
                    r = await self._unless_lost(worker, self.http.post(
                        self._url(worker, "/internal/generate"), json=self._payload(t)))
                except RETRYABLE as e:
                    raise WorkerUnreachable(worker) from e
                if _engine_failed(r.status_code, r.content):
                    raise WorkerUnreachable(worker)
                if r.status_code != 200:
                    raise UpstreamError(r.status_code, r.content)
                if local and t.ttft_s is None:
                    t.admitted = t.admitted or sent
                    ttft = (sent - t.arrival) + float(r.headers.get("x-warmpath-ttft-s", 0.0))
                    t.first_token_at, t.ttft_s = t.arrival + ttft, ttft
                    t.queue_s = (t.admitted - t.arrival) + float(r.headers.get("x-warmpath-queue-s", 0.0))
                    self.s.metrics.first_token(t.cls, t.ttft_s, t.queue_s)
                t.completion_tokens = r.json().get("usage", {}).get("completion_tokens", 0)
                t.timing["decode"] = time.monotonic() - sent
                return r.content
            head, lines, up = await self._unless_lost(worker, self._open_stream(t, worker))
            self._got_first(t)
            t.timing["decode_first"] = time.monotonic() - sent
            return head, lines, up
        finally:
            self.p.add(worker, -computed, 0)

    async def _open_stream(self, t: Trip, worker: str):
        """Send a streamed ``/internal/generate`` and read until the first token (retryable
        failures before it raise :class:`WorkerUnreachable`)."""
        try:
            up = await self.http.send(self.http.build_request(
                "POST", self._url(worker, "/internal/generate"), json=self._payload(t)), stream=True)
        except RETRYABLE as e:
            raise WorkerUnreachable(worker) from e
        try:
            if up.status_code != 200:
                content = await up.aread()
                if _engine_failed(up.status_code, content):
                    raise WorkerUnreachable(worker)
                raise UpstreamError(up.status_code, content)
            lines = up.aiter_lines()
            head: list[str] = []
            async for line in lines:
                if not line:
                    continue
                head.append(line)
                if line == "data: [DONE]" or _has_token(line):
                    break
            if head and '"engine_failed"' in head[-1] and not any(_has_token(x) for x in head[:-1]):
                raise WorkerUnreachable(worker)   # its engine stopped before this request got a token
        except RETRYABLE as e:
            await up.aclose()
            raise WorkerUnreachable(worker) from e
        except BaseException:
            await up.aclose()
            raise
        return head, lines, up


def _bad_gateway(worker: str, e: ValidationError) -> bytes:
    from warmpath.protocol.errors import APIError

    return json.dumps(APIError(502, f"worker {worker} answered a malformed prefill reply: "
                                    f"{e.errors()[0].get('msg')}").body()).encode()


def _has_token(line: str) -> bool:
    """Whether an SSE data line carries generated text (not the chat role chunk)."""
    if not line.startswith("data: {"):
        return False
    try:
        ch = json.loads(line[6:]).get("choices") or []
    except json.JSONDecodeError:
        return False
    return any((c.get("delta") or {}).get("content") or c.get("text") or c.get("finish_reason")
               for c in ch) or "error" in line[6:40]

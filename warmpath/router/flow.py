"""The owner of a request's trip through the router: route decision, admission, prefill (+ handoff),
decode, retries, and every book kept on the way (timing, metrics, load, sessions).

* Disaggregated (``cpd``, ``pd``): the prefill worker runs the prompt to its first token and
  writes the prompt's blocks through to L3; the decode worker gets (prompt, first token),
  reports the token at once, loads the blocks and generates the rest. Between vLLM workers
  the prompt's KV goes through vLLM's KV connector instead (``handoff.py``).
* PPD local (turn 2+): the session's decode worker runs the append-prefill itself.
* ``replica``: one worker does both.

Failures before the client saw a token are retried once elsewhere; after that the stream
ends with an OpenAI-shaped error event (``relay.py``). HTTP is ``dispatch.WorkerClient``'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import replace

from fastapi.responses import Response

from warmpath.protocol.errors import APIError
from warmpath.protocol.internal import GenerateRequest, PrefillRequest
from warmpath.protocol.openai import SamplingFields
from warmpath.router.dispatch import UpstreamError, WorkerClient, WorkerUnreachable
from warmpath.router.handoff import handoff_for
from warmpath.routing.latency import PrefillObservation
from warmpath.router.relay import relay
from warmpath.routing.views import predicted_headers
from warmpath.routing.sessions import SessionState
from warmpath.router.state import RouterState
from warmpath.router.trip import Trip
from warmpath.routing.views import Decision, RequestView


log = logging.getLogger(__name__)

class RequestFlow:
    """Runs requests; every admitted request gives its slot back exactly once."""

    def __init__(self, state: RouterState, client: WorkerClient) -> None:
        self.s, self.client = state, client

    def decide_route(self, rv: RequestView, sess: SessionState | None, allow_local: bool = True,
                     arrival: bool = True) -> Decision:
        """The route decision (``routing/route.py``) over the state now; 503 when no worker can take it."""
        try:
            return self.s.decider.decide_route(rv, self.s.snapshot(rv, sess.decode_worker if sess else None), allow_local,
                                       arrival)
        except LookupError as e:
            raise APIError(503, str(e), err_type="server_error") from e

    def would_route(self, rv: RequestView, sess: SessionState | None) -> Decision:
        """The decision for ``rv`` now, as a second look (nothing counted): ``/internal/decide``."""
        return self.decide_route(rv, sess, arrival=False)

    async def serve(self, key: int, rv: RequestView, sess: SessionState | None, ids: list[int],
                    body: SamplingFields, kind: str, arrival: float) -> Response:
        """Decide the route, admit (429 / wait), then run the request to its response."""
        d = await self._admit(key, rv, sess, self.decide_route(rv, sess))
        try:
            d = await self._hold(rv, sess, d)
        except BaseException:   # the client left while held (or no worker is left): the slot goes on
            self.s.release(tenant=rv.tenant)
            raise
        t = Trip(rv, ids, body, kind, arrival, d, admitted=time.monotonic(),
                 worker_priority=self.s.admission.worker_priority(rv.tenant, rv.priority))
        t.timing["route"] = t.admitted - arrival
        self.s.ledger.dispatched(sess)
        self._count(d, rv)
        try:
            return await self._run(t, sess)
        except BaseException:
            self.s.release(tenant=rv.tenant)
            raise

    async def _admit(self, key: int, rv: RequestView, sess: SessionState | None, d: Decision) -> Decision:
        """Take an in-flight slot (429 when the queues are full too); a request that waited
        is routed again, since the cluster moved on meanwhile."""
        s = self.s
        verdict = s.ledger.admit(key, rv, d, time.monotonic())
        s.metrics.tenant_requests.labels(s.metrics.tenant(rv.tenant), "admitted" if verdict in ("run", "queued")
                                         else verdict).inc()
        if verdict == "rejected":
            s.metrics.rejected.inc()
            raise APIError(429, "too many requests in flight; retry later", err_type="rate_limit_error")
        if verdict == "limited":
            s.metrics.rejected.inc()
            wait = max(1, math.ceil(s.admission.retry_after_s))
            raise APIError(429, f"tenant {rv.tenant!r} is past its tokens per second; retry in {wait} s",
                           err_type="rate_limit_error", code="tenant_limit", headers={"Retry-After": str(wait)})
        if verdict != "queued":
            return d
        ev = s.waiters[key] = asyncio.Event()
        try:
            await ev.wait()
        except asyncio.CancelledError:  # the client left while waiting
            s.waiters.pop(key, None)
            if not s.ledger.abandoned_waiting(key):
                s.release(tenant=rv.tenant)  # we had already been given the slot: hand it on
            raise
        try:
            return self.decide_route(rv, sess, arrival=False)
        except BaseException:
            s.release(tenant=rv.tenant)
            raise

    async def _hold(self, rv: RequestView, sess: SessionState | None, d: Decision) -> Decision:
        """A decision that holds the request (``Decision.hold_s``, the goodput policy's: no path
        keeps the decodes within their TPOT bound now and its TTFT has slack) is made again
        after each hold, knowing how long it has been held (the simulator does the same)."""
        if d.hold_s <= 0:
            return d
        since = time.monotonic()
        while d.hold_s > 0:
            await asyncio.sleep(d.hold_s)
            d = self.decide_route(self.s.ledger.held(rv, since, time.monotonic()), sess, arrival=False)
        self.s.metrics.held.observe(time.monotonic() - since)
        return d

    def _count(self, d: Decision, rv: RequestView) -> None:
        m = self.s.metrics
        m.requests.labels(d.path, d.cls).inc()
        if d.ppd:
            m.ppd.labels(d.ppd).inc()
        m.prefix.labels("cached").inc(d.cached_tokens)
        m.prefix.labels("computed").inc(rv.num_tokens - d.cached_tokens)

    async def _run(self, t: Trip, sess: SessionState | None) -> Response:
        """Prefill (when disaggregated) then decode; one retry elsewhere before any token."""
        s = self.s
        for attempt in range(2):
            d = t.decision
            try:
                if t.first_token is None:  # the worker computing the prompt will hold its blocks
                    with s.lock:
                        w = d.prefill or d.decode
                        s.index.note_routed(w, s.hashes_for(w, t.rv), time.monotonic())
                    if d.prefill not in (None, d.decode):
                        with s.load.holding(d.prefill, d.decode), s.load.bound_for(   # a drain of either waits
                                d.decode, str(id(t)), time.monotonic() + d.est_ttft_s, d.est_handoff_load_s):
                            await self._prefill(t, d.prefill)
                return await self._decode(t, sess)
            except WorkerUnreachable as e:
                s.remove(e.args[0], "unreachable")
                s.metrics.retries.inc()
                if attempt == 1:
                    s.metrics.failed.labels("route").inc()
                    raise APIError(503, f"no worker could take the request: {e.args[0]} failed",
                                   err_type="server_error") from e
                t.decision = self._reroute(t, sess)
            except UpstreamError as e:
                s.metrics.failed.labels("upstream").inc()
                s.release(tenant=t.rv.tenant)
                return Response(e.content, status_code=e.status, media_type="application/json")
        raise AssertionError("unreachable")

    def _reroute(self, t: Trip, sess: SessionState | None) -> Decision:
        """After a worker failed: decide again (no PPD-local: its decode worker may be the one
        that failed), or, once the first token exists (its KV is in L3), any decode worker."""
        if t.first_token is None:   # a vLLM hand-off's KV may be gone with its decode worker: prefill again
            t.prefill = t.handoff = None
            return self.decide_route(t.rv, sess, allow_local=False, arrival=False)
        try:
            return replace(t.decision, decode=self.s.decider.decode_for(self.s.snapshot(t.rv, None)))
        except LookupError as e:
            raise APIError(503, str(e), err_type="server_error") from e

    async def _prefill(self, t: Trip, worker: str) -> None:
        engines = self.s.namespaces.engine_of
        handoff = handoff_for(engines(worker), engines(t.decision.decode))
        self.s.routed[worker] = self.s.routed.get(worker, 0) + 1
        sent = time.monotonic()
        with self.s.load.computing(worker, t.rv.num_tokens - t.decision.cached_tokens):
            reply = await self.client.prefill(worker, PrefillRequest(prompt_token_ids=t.ids,
                                                                     request=_forwarded(t)))
        handoff.check(reply, worker)
        t.prefilled(self.s.metrics, reply, sent, handoff)
        self.s.decider.observe_prefill(PrefillObservation(
            worker, reply.prompt_tokens, reply.cached_tokens, reply.cached_by_tier.L3, reply.queue_s, reply.prefill_s,
            reply.l3_get_s, reply.l3_put_s, reply.kv_bytes, t.timing["prefill"]),
            self.s.registry.workers[worker].view if worker in self.s.registry.workers else None)

    def _generate_msg(self, t: Trip) -> GenerateRequest:
        req = _forwarded(t)
        if t.body.stream:   # the usage chunk tells the router how many tokens went out
            req["stream_options"] = {"include_usage": True}
        fields = t.handoff.decode_fields(t.prefill) if t.prefill is not None and t.handoff else {}
        return GenerateRequest(kind=t.kind, prompt_token_ids=t.ids, request=req, **fields)

    async def _decode(self, t: Trip, sess: SessionState | None) -> Response:
        s, d = self.s, t.decision
        s.routed[d.decode] = s.routed.get(d.decode, 0) + 1
        headers = {"X-Warmpath-Route": d.path, "X-Warmpath-Decode": d.decode,
                   "X-Warmpath-Worker": d.prefill or d.decode, "X-Warmpath-Tenant": t.rv.tenant,
                   "X-Warmpath-Priority": str(t.rv.priority), **predicted_headers(d)}
        computed = t.rv.num_tokens - d.cached_tokens if t.prefill is None else 0
        s.load.add(d.decode, running=1, context=_context(t))
        sent = time.monotonic()
        release = s.load.start_computing(d.decode, computed)
        # a stream returns at its first token; a whole answer only at its end, so its prompt
        # leaves the book at its predicted first token (else the worker would look busy
        # computing it for as long as it decodes)
        timer = (asyncio.get_running_loop().call_later(max(0.0, d.est_ttft_s), release)
                 if computed and not t.body.stream and math.isfinite(d.est_ttft_s) else None)
        try:
            if t.body.stream:
                up = await self.client.stream(d.decode, self._generate_msg(t))
            else:
                r = await self.client.generate(d.decode, self._generate_msg(t))
        except BaseException:
            s.load.add(d.decode, running=-1, context=-_context(t))
            raise
        finally:
            if timer is not None:
                timer.cancel()
            release()
        if t.body.stream:
            t.first_token_seen(s.metrics, time.monotonic())
            t.timing["decode_first"] = time.monotonic() - sent
            headers["Server-Timing"] = t.server_timing()
            return relay(s, t, up, lambda: self._ended(t, sess), headers)
        if t.ttft_s is None:   # computed on the worker: its own TTFT and queue time
            t.first_token_seen(s.metrics, sent + float(r.headers.get("x-warmpath-ttft-s", 0.0)),
                               float(r.headers.get("x-warmpath-queue-s", 0.0)))
        t.usage = r.json().get("usage")
        t.completion_tokens = (t.usage or {}).get("completion_tokens", 0)
        t.timing["decode"] = time.monotonic() - sent
        headers["Server-Timing"] = t.server_timing()
        self._ended(t, sess)
        return Response(r.content, media_type="application/json", headers=headers)

    def _learn(self, t: Trip) -> None:
        """The decode worker's own timings in the answer's usage (vLLM workers report them)
        refit its lines; its prefill line only when it computed the prompt (no handoff)."""
        w = self.s.registry.workers.get(t.decision.decode)
        self.s.ledger.answered(t.decision.decode, t.usage, w.view if w is not None else None,
                               computed_here=t.prefill is None)

    def _ended(self, t: Trip, sess: SessionState | None) -> None:
        s = self.s
        s.load.add(t.decision.decode, running=-1, context=-_context(t))
        tpot = t.finished(s.metrics)
        ttft = t.first_token_at - t.admitted if t.first_token_at is not None else None
        end = s.ledger.ended(t.decision, t.rv.num_tokens, t.completion_tokens or 0, ttft, tpot, sess, t.rv.tenant)
        s.wake(end.woken)   # the slot went on exactly once, whatever the books below make of the answer
        if sess is not None and t.rv.session_id and s.cfg.peers.peers:   # the other routers learn where its KV is
            s.turns_out.append((t.rv.session_id, sess.decode_worker, sess.context_tokens, sess.turns))
        try:   # the worker's own report (usage) feeds these: a malformed one must not fail the answer
            self._learn(t)
            if end.ttft_err is not None:
                s.metrics.ttft_error.observe(end.ttft_err)
            if end.tpot_err is not None:
                s.metrics.tpot_error.observe(end.tpot_err)
            s.dashboard.trip_ended(t)
        except Exception:
            log.exception("the books of a request's end (its answer was sent)")


def _context(t: Trip) -> int:
    """The context a running request holds on its decode worker, on average over its answer."""
    return t.rv.num_tokens + t.rv.max_tokens // 2


def _forwarded(t: Trip) -> dict:
    """The request's sampling fields for a worker, with the priority the workers order and
    preempt it by (``Admission.worker_priority``: its band, then its tenant's share)."""
    req = t.body.forwarded()
    req.pop("priority", None)
    if t.worker_priority:
        req["priority"] = t.worker_priority
    return req

"""The router's request flow after admission: prefill (+ handoff) then decode, with the
retry rules, the relay of the worker's stream, and the session / load bookkeeping."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import httpx
from fastapi.responses import Response, StreamingResponse

from warmpath.router.dispatch import Dispatcher, Planner, Trip, UpstreamError, WorkerUnreachable
from warmpath.router.state import RequestView
from warmpath.protocol.errors import APIError


class RequestFlow:
    """Runs admitted requests; ``release`` gives the admission slot back (exactly once)."""

    def __init__(self, state, planner: Planner, disp: Dispatcher) -> None:
        self.state, self.planner, self.disp = state, planner, disp

    def release(self) -> None:
        nxt = self.state.admission.release()
        if nxt is not None and nxt in self.state.waiters:
            self.state.waiters.pop(nxt).set()

    def plan(self, rv: RequestView, sess, allow_local: bool = True):
        try:
            return self.planner.plan(rv, sess, allow_local)
        except LookupError as e:
            raise APIError(503, str(e), err_type="server_error") from e

    async def run(self, t: Trip, sess) -> Response:
        """Prefill (when disaggregated) then decode; one retry elsewhere before any token."""
        for attempt in range(2):
            d = t.decision
            self.state.routed[d.decode] = self.state.routed.get(d.decode, 0) + 1
            try:
                if t.first_token is None:  # the worker computing the prompt will hold its blocks
                    with self.state.lock:
                        self.state.index.note_routed(d.prefill or d.decode, t.rv.block_hashes, time.monotonic())
                if t.first_token is None and d.prefill not in (None, d.decode):
                    self.state.routed[d.prefill] = self.state.routed.get(d.prefill, 0) + 1
                    await self.disp.prefill(t, d.prefill)
                return await self.decode(t, sess)
            except WorkerUnreachable as e:
                self.disp.lost(e.args[0])
                if attempt == 1:
                    self.state.metrics.failed.labels("route").inc()
                    raise APIError(503, f"no worker could take the request: {e.args[0]} failed",
                                   err_type="server_error") from e
                if t.first_token is None:
                    t.decision = self.plan(t.rv, sess, allow_local=False)
                else:  # the first token exists and its KV is in L3: any decode worker can go on
                    try:
                        dec = self.state.policy.decode_for(self.planner.snapshot(t.rv, None)).worker_id
                    except LookupError as le:
                        raise APIError(503, str(le), err_type="server_error") from le
                    t.decision = replace(d, decode=dec)
            except UpstreamError as e:
                self.state.metrics.failed.labels("upstream").inc()
                self.release()
                return Response(e.content, status_code=e.status, media_type="application/json")
        raise AssertionError("unreachable")

    def ended(self, t: Trip, sess) -> None:
        self.planner.add(t.decision.decode, running=-1)
        self.disp.finished(t)
        if sess is not None:
            sess.decode_worker = t.decision.decode
            sess.context_tokens = t.rv.num_tokens + t.completion_tokens
        self.release()

    async def decode(self, t: Trip, sess) -> Response:
        d = t.decision
        headers = {"X-Warmpath-Route": d.tier, "X-Warmpath-Decode": d.decode,
                   "X-Warmpath-Worker": d.prefill or d.decode}
        self.planner.add(d.decode, running=1)
        try:
            res = await self.disp.generate(t, d.decode)
        except BaseException:
            self.planner.add(d.decode, running=-1)
            raise
        headers["Server-Timing"] = t.server_timing()
        if not t.body.stream:
            self.ended(t, sess)
            return Response(res, media_type="application/json", headers=headers)
        head, lines, up = res
        want_usage = t.body.include_usage

        def out(line: str) -> bytes | None:
            if line.startswith("data: {") and '"choices": []' in line:  # the usage chunk
                t.completion_tokens = json.loads(line[6:]).get("usage", {}).get("completion_tokens", 0)
                if not want_usage:
                    return None
            return (line + "\n\n").encode()

        async def relay():
            try:
                for line in head:
                    if (b := out(line)) is not None:
                        yield b
                async for line in lines:
                    if line and (b := out(line)) is not None:
                        yield b
            except httpx.HTTPError as e:
                # The worker died mid-stream: tokens already went out, so no retry; end the
                # stream with an OpenAI-shaped error event the client can read.
                self.state.mid_stream_failures += 1
                self.state.metrics.failed.labels("stream").inc()
                err = APIError(502, f"worker {d.decode} failed mid-stream: {type(e).__name__}",
                               err_type="server_error")
                yield f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
            finally:
                await up.aclose()
                self.ended(t, sess)

        return StreamingResponse(relay(), media_type="text/event-stream", headers=headers)

"""The router's OpenAI request handler: validate what only the router knows, tokenize and
hash off the event loop, plan, admit (429 / queue), then hand the trip to the flow."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request
from fastapi.responses import Response

from warmpath.kv.hashing import hash_prefix_blocks
from warmpath.models.tokenizer import ChatTemplateError
from warmpath.protocol.errors import APIError, bad
from warmpath.protocol.internal import MAX_PROMPT_IDS
from warmpath.protocol.openai import ChatCompletionRequest, SamplingFields, check_prompt_chars
from warmpath.router.dispatch import Trip
from warmpath.router.flow import RequestFlow
from warmpath.router.sessions import session_id
from warmpath.router.state import Decision, RequestView


class RequestHandler:
    """``await handler(req, body)`` answers one chat or text completion request."""

    def __init__(self, state, flow: RequestFlow) -> None:
        self.state, self.flow = state, flow

    async def __call__(self, req: Request, body: SamplingFields) -> Response:
        arrival = time.monotonic()
        ids, msgs = await self._tokens(body)
        rv, sess = self._view(req, body, ids, msgs, arrival)
        d = self.flow.plan(rv, sess)
        cls = "warm" if 2 * d.cached_tokens >= rv.num_tokens else "cold"
        d = await self._admit(id(req), rv, sess, d, cls)
        t = Trip(rv, ids, body, "chat" if msgs is not None else "text", cls, arrival,
                 admitted=time.monotonic(), decision=d)
        t.timing["route"] = t.admitted - arrival
        if sess is not None:
            sess.turns += 1
        self._count(d, cls, rv)
        try:
            return await self.flow.run(t, sess)
        except BaseException:
            self.flow.release()
            raise

    def _tokenize(self, body: SamplingFields) -> tuple[list[int], list | None]:
        tok = self.state.tok
        if isinstance(body, ChatCompletionRequest):
            msgs = body.flat_messages()
            try:
                return tok.encode(tok.apply_chat_template(msgs), add_special=False), msgs
            except ChatTemplateError as e:
                raise bad("messages", str(e)) from e
        p = body.prompt
        return (tok.encode(p) if isinstance(p, str) else p), None

    async def _tokens(self, body: SamplingFields) -> tuple[list[int], list | None]:
        """The prompt's token ids (and flat messages for chat), after the checks that need
        the router's tokenizer and the workers' context window."""
        s = self.state
        if body.model is not None and body.model != s.model_id:
            raise APIError(400, f"model {body.model!r} does not exist; available: {s.model_id!r}",
                           param="model", code="model_not_found")
        vocab = s.tok.vocab_size
        if any(t >= vocab for t in body.stop_token_ids):
            raise bad("stop_token_ids", f"token ids must be in [0, {vocab})")
        param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        check_prompt_chars(body.prompt_chars(), s.max_model_len, param)
        ids, msgs = await asyncio.to_thread(self._tokenize, body)   # a long prompt must not stall the loop
        if msgs is None and any(t >= vocab for t in ids):
            raise bad("prompt", f"token ids must be in [0, {vocab})")
        limit = min(s.max_model_len or MAX_PROMPT_IDS, MAX_PROMPT_IDS)
        if len(ids) >= limit:
            raise bad(param, f"{param}: the prompt has {len(ids)} tokens; the context window is {limit} tokens")
        return ids, msgs

    def _view(self, req: Request, body: SamplingFields, ids: list[int], msgs, arrival: float):
        """The request as the policies see it (block hashes, session, turn) and its session."""
        s = self.state
        if s.namespace is None or not s.registry.workers:
            raise APIError(503, "no worker registered yet", err_type="server_error")
        ns = s.namespace.with_salt(body.cache_salt)
        sid = session_id(body.user, req.headers.get("x-session-id"), msgs)
        sess = s.sessions.touch(sid, arrival) if sid else None
        held = sess.context_tokens if sess else 0
        rv = RequestView(len(ids), tuple(hash_prefix_blocks(ns, ids)), ns.block_size, sid,
                         turn=(sess.turns + 1) if sess else 1,
                         new_tokens=len(ids) - held if 0 < held < len(ids) else len(ids),
                         max_tokens=body.max_new_tokens or 128)
        return rv, sess

    async def _admit(self, key: int, rv: RequestView, sess, d: Decision, cls: str) -> Decision:
        """Take an in-flight slot (429 when the queues are full too); a request that waited
        is planned again, since the cluster moved on meanwhile."""
        s, flow = self.state, self.flow
        verdict = s.admission.offer(key, d.tier if d.tier in ("cold", "warm") else cls)
        if verdict == "rejected":
            s.metrics.rejected.inc()
            raise APIError(429, "too many requests in flight; retry later", err_type="rate_limit_error")
        if verdict != "queued":
            return d
        ev = s.waiters[key] = asyncio.Event()
        try:
            await ev.wait()
        except asyncio.CancelledError:  # the client left while waiting
            s.waiters.pop(key, None)
            if not s.admission.cancel(key):
                flow.release()  # we had already been given the slot: hand it on
            raise
        try:
            return flow.plan(rv, sess)
        except BaseException:
            flow.release()
            raise

    def _count(self, d: Decision, cls: str, rv: RequestView) -> None:
        m = self.state.metrics
        m.requests.labels(d.tier, cls).inc()
        if d.ppd:
            m.ppd.labels(d.ppd).inc()
        m.prefix.labels("cached").inc(d.cached_tokens)
        m.prefix.labels("computed").inc(rv.num_tokens - d.cached_tokens)

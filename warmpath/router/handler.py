"""The router's OpenAI request handler: validate what only the router knows, tokenize and
hash off the event loop, then hand the request to the flow (route decision, admission, the trip)."""

from __future__ import annotations

import array
import asyncio
import time
from typing import Awaitable

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from warmpath.kv.hashing import token_array
from warmpath.models.tokenizer import ChatTemplateError
from warmpath.protocol.errors import APIError, bad
from warmpath.protocol.internal import MAX_PROMPT_IDS
from warmpath.protocol.openai import ChatCompletionRequest, SamplingFields, check_prompt_chars
from warmpath.router.flow import RequestFlow
from warmpath.routing.route import answer_budget
from warmpath.routing.sessions import session_id
from warmpath.routing.tenants import priority_of
from warmpath.router.state import RouterState


DISCONNECT_POLL_S = 0.25


async def unless_gone(req: Request, work: Awaitable[Response], poll_s: float = DISCONNECT_POLL_S) -> Response:
    """``await work``, cancelled when the client disconnects first (answered 499, which no
    one reads): its worker calls are closed, so the workers abort it and free its KV blocks.

    NOTE: Starlette cancels nothing when a client leaves before the response starts; without
    this a client gone from a long non-streamed request kept a worker generating for nobody.
    """
    task = asyncio.ensure_future(work)
    try:
        while not (await asyncio.wait({task}, timeout=poll_s))[0]:
            if await req.is_disconnected():
                task.cancel()
                break
    finally:
        if not task.done():   # this handler itself was cancelled
            task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        if task.cancelled() and not asyncio.current_task().cancelling():
            return Response(status_code=499)
        raise


class RequestHandler:
    """``await handler(req, body)`` answers one chat or text completion request."""

    def __init__(self, state: RouterState, flow: RequestFlow) -> None:
        self.state, self.flow = state, flow

    async def __call__(self, req: Request, body: SamplingFields) -> Response:
        arrival = time.monotonic()
        ids, packed, msgs = await self._tokens(body)
        rv, sess = self._view(req, body, packed, msgs, arrival)
        return await unless_gone(req, self.flow.serve(id(req), rv, sess, ids, body,
                                                      "chat" if msgs is not None else "text", arrival))

    async def would_route(self, req: Request, body: SamplingFields):
        """Where this request would go now, without sending it (``POST /internal/decide``):
        the same tokenization, view and decision, no admission, no session touched, nothing
        counted. Two routers asked the same show whether they agree (``benchmarks/reliability/router_ha.py``)."""
        ids, packed, msgs = await self._tokens(body)
        rv, sess = self._view(req, body, packed, msgs, time.monotonic(), touch=False)
        return self.flow.would_route(rv, sess)

    def _tokenize(self, body: SamplingFields) -> tuple[list[int], array.array, list | None]:
        """The prompt's ids: the list the workers' messages carry, and the same ids as a compact
        ``array('I')`` that the checks and the block hasher read (no Python int per id there)."""
        tok = self.state.tok
        if isinstance(body, ChatCompletionRequest):
            msgs = body.flat_messages()
            try:
                ids = tok.encode(tok.apply_chat_template(msgs), add_special=False)
            except ChatTemplateError as e:
                raise bad("messages", str(e)) from e
            return ids, token_array(ids), msgs
        p = body.prompt
        ids = tok.encode(p) if isinstance(p, str) else p
        return ids, token_array(ids), None

    async def _tokens(self, body: SamplingFields) -> tuple[list[int], array.array, list | None]:
        """The prompt's token ids (a list and an ``array('I')``, and flat messages for chat),
        after the checks that need the router's tokenizer and the workers' context window."""
        s = self.state
        if body.model is not None and body.model != s.model_id:
            raise APIError(400, f"model {body.model!r} does not exist; available: {s.model_id!r}",
                           param="model", code="model_not_found")
        vocab = s.tok.vocab_size
        if any(t >= vocab for t in body.stop_token_ids):
            raise bad("stop_token_ids", f"token ids must be in [0, {vocab})")
        param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        check_prompt_chars(body.prompt_chars(), s.max_model_len, param)
        ids, packed, msgs = await asyncio.to_thread(self._tokenize, body)   # a long prompt must not stall the loop
        if msgs is None and len(packed) and int(np.frombuffer(packed, np.uint32).max()) >= vocab:
            raise bad("prompt", f"token ids must be in [0, {vocab})")
        limit = min(s.max_model_len or MAX_PROMPT_IDS, MAX_PROMPT_IDS)
        if len(ids) >= limit:
            raise bad(param, f"{param}: the prompt has {len(ids)} tokens; the context window is {limit} tokens")
        return ids, packed, msgs

    def _view(self, req: Request, body: SamplingFields, ids: array.array, msgs, arrival: float, touch: bool = True):
        """The request as the policies see it (block hashes, session, turn) and its session
        (``touch=False``: read, not created or refreshed)."""
        s = self.state
        tenant = s.tenant_of(req)   # bad identity input is a 400 whatever the fleet's state
        try:
            priority = priority_of(body.priority, req.headers.get("x-priority"))
        except ValueError as e:
            raise bad("priority", str(e)) from e
        if s.namespace is None or not s.registry.workers:
            raise APIError(503, "no worker registered yet", err_type="server_error")
        ns = s.namespace.with_salt(body.cache_salt)
        sid = session_id(body.user, req.headers.get("x-session-id"), msgs)
        sess = (s.sessions.touch(sid, arrival) if touch else s.sessions.sessions.get(sid)) if sid else None
        hashes = s.hash_cache.hashes(ns, ids, sid)   # = hash_prefix_blocks(ns, ids), the session's reused
        others = {o: s.hash_cache.hashes(o.with_salt(body.cache_salt), ids, sid)   # once per other namespace
                  for o in s.namespaces.others(s.namespace)}
        try:   # booked and predicted with the budget the worker will give it
            budget = answer_budget(body.max_new_tokens, [r.view for r in s.registry.workers.values()], len(ids),
                                   s.max_model_len)
        except LookupError as e:
            raise APIError(503, str(e), err_type="server_error") from e
        rv = s.decider.request_view(len(ids), hashes, ns.block_size, sid, sess, budget, others,
                                    tenant=tenant, priority=priority)
        return rv, sess

"""Worker endpoints the router calls in disaggregated topologies (not part of the OpenAI API).

``POST /internal/prefill`` (:class:`~warmpath.protocol.internal.PrefillRequest` →
:class:`~warmpath.protocol.internal.PrefillReply`)
    Runs the prompt to its first token. With write-through (the default for prefill roles)
    every sealed block of the prompt is in L3 before the answer leaves: that is the P→D
    handoff. The reply carries what this worker measured: its cached tokens by tier, the
    bytes it wrote to L3 for the request (``kv_bytes``) and the prompt blocks in L3 after it.

``POST /internal/generate`` (:class:`~warmpath.protocol.internal.GenerateRequest`)
    The client's OpenAI response (streamed or not). With ``first_token`` this is the decode
    side of a handoff: the token is reported at once, the prompt's blocks come from L3 (or
    are recomputed when missing), generation continues after it. Without it the worker
    computes the prompt itself: a PPD append-prefill on a decode worker, or a replica.
    ``prefill`` (what the prefill stage measured) is relayed in ``usage["warmpath"]``.

``POST /internal/fault`` (only with fault injection on: tests and chaos runs)
    ``{"kind": "engine-crash"}`` stops the engine thread as an engine bug would;
    ``{"kind": "sampler-seed", "seed": N}`` makes sampling fail for requests seeded ``N``;
    ``{"kind": "l3-corrupt", "count": N, "seed": S}`` flips a bit in N blocks this worker
    stored in L3 (picked with seed S from its record; loads must refuse them);
    ``{"kind": "l3-fill", "bytes": B}`` puts B bytes of junk into the store (eviction).
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from warmpath.engine.async_engine import AsyncEngine
from warmpath.worker.front import WorkerFront, engine_error
from warmpath.protocol.internal import GenerateRequest, PrefillReply, PrefillRequest, TierTokens
from warmpath.protocol.openai import Seed
from warmpath.protocol.openapi import BODY, ChatCompletion, TextCompletion, errors, generation


def add_internal_routes(app: FastAPI, front: WorkerFront, dependencies: list | None = None) -> None:
    """Register ``/internal/prefill`` and ``/internal/generate`` on a worker's app
    (``dependencies``: the cluster-token check)."""
    engine, aengine = front.engine, front.aengine

    def l3_seconds() -> tuple[float, float]:
        """This worker's cumulative L3 (read, write) seconds."""
        t = engine.tiers
        return (t.l3.stats.read_seconds, t.l3.stats.write_seconds) if t is not None and t.l3 is not None else (0.0, 0.0)

    @app.post("/internal/prefill", dependencies=dependencies,
              responses={200: {"model": PrefillReply}, **errors(*BODY, 429, 500, 503)})
    async def prefill(body: PrefillRequest, req: Request) -> Response:
        ids = body.prompt_token_ids
        (get0, put0), t0 = l3_seconds(), time.monotonic()
        job = front.admit(body.request, ids, "text", "prompt_token_ids", run_tokens=1)
        while True:
            try:
                item = await asyncio.wait_for(job.handle.queue.get(), 0.25)
            except asyncio.TimeoutError:
                if await req.is_disconnected():
                    aengine.abort(job.rid)
                    return Response(status_code=499)
                continue
            if isinstance(item, Exception):
                raise engine_error(item)
            break
        block_bytes = engine.tiers.block_bytes if engine.tiers is not None else 0
        get1, put1 = l3_seconds()
        reply = PrefillReply(token=item.new_token_ids[-1], prompt_tokens=len(ids),
                             cached_tokens=item.cached_tokens, queue_s=item.queue_time or 0.0,
                             prefill_s=time.monotonic() - t0, kv_blocks=item.l3_prompt_blocks or 0,
                             kv_bytes=item.l3_written_blocks * block_bytes, l3_get_s=max(0.0, get1 - get0),
                             l3_put_s=max(0.0, put1 - put0),
                             cached_by_tier=TierTokens(**(item.cached_by_tier or {})))
        return JSONResponse(reply.model_dump())

    @app.post("/internal/generate", dependencies=dependencies,
              responses=generation(ChatCompletion | TextCompletion, 429, 500, 503))
    async def generate(body: GenerateRequest, req: Request) -> Response:
        first = body.first_token
        job = front.admit(body.request, body.prompt_token_ids, body.kind, "prompt_token_ids",
                    output_prefix=[first] if first is not None else None)
        stage = body.prefill
        if stage is not None:
            job.prefill = stage.model_dump(exclude_none=True)
        job.handoff = first is not None
        return await front.respond(req, job)


class Fault(BaseModel):
    """A fault to inject (see the module docstring)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    kind: Literal["engine-crash", "sampler-seed", "l3-corrupt", "l3-fill"]
    seed: Seed | None = None
    count: int = Field(default=1, ge=1, le=4096)
    bytes: int = Field(default=0, ge=0, le=1 << 40)


def add_fault_routes(app: FastAPI, aengine: AsyncEngine, dependencies: list | None = None) -> None:
    """``POST /internal/fault``: fault injection (never on unless the operator asks)."""

    @app.post("/internal/fault", dependencies=dependencies, responses=errors(*BODY))
    async def fault(body: Fault) -> dict:
        from warmpath.protocol.errors import bad

        if body.kind.startswith("l3-"):
            return {"ok": True, "kind": body.kind, **await asyncio.to_thread(_l3_fault, aengine, body)}
        if body.kind == "engine-crash":
            aengine.inject_crash()
        else:
            if body.seed is None:
                raise bad("seed", "'seed' is required for a sampler-seed fault")
            aengine.engine.runner.sampler.fail_seeds.add(body.seed)
        return {"ok": True, "kind": body.kind}


def _l3_fault(aengine: AsyncEngine, body: Fault) -> dict:
    """An ``l3-*`` fault on this worker's L3 client (off the event loop)."""
    import random

    from warmpath.kv.l3_faults import corrupt_blocks, fill_store
    from warmpath.protocol.errors import bad

    tiers = aengine.engine.tiers
    if tiers is None or tiers.l3 is None or not tiers.l3.available:
        raise bad("kind", f"{body.kind}: this worker has no L3 store reachable now")
    if body.kind == "l3-fill":
        return fill_store(tiers.l3, body.bytes)
    for _ in range(10):   # NOTE: the engine thread may grow the record meanwhile
        try:
            known = list(tiers.rules.l3_known)
            break
        except RuntimeError:
            continue
    else:
        known = []
    picked = random.Random(body.seed).sample(known, min(body.count, len(known)))
    done = corrupt_blocks(tiers.l3, picked, body.seed)
    return {"corrupted": len(done), "hashes": [h.hex() for h in done]}

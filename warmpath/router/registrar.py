"""A worker's registration at the router: from its own ``POST /internal/register``, or read
from a peer router by a router that starts (``router/peers.py``)."""

from __future__ import annotations

import asyncio
import time

import httpx

from warmpath.kv.hashing import KVNamespace
from warmpath.protocol.errors import APIError, bad
from warmpath.protocol.internal import Registration


def registrar(state, http: httpx.AsyncClient):
    """The registration of a worker (``/internal/register``, or read from a peer router):
    raises :class:`APIError` (400 for a namespace the fleet cannot share, 409 for an id in use)."""

    async def answers(url: str) -> bool:
        try:
            return (await http.get(url + "/health", timeout=1.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def register(b: Registration) -> None:
        try:
            ns = KVNamespace(**b.namespace.model_dump())
        except (ValueError, TypeError) as e:
            raise bad("namespace", f"namespace: {e}") from e
        try:
            state.namespaces.check(b.worker_id, b.role, ns, state.namespace, b.engine)
        except ValueError as e:
            raise bad("namespace", str(e)) from e
        if state.namespace is None:
            state.namespace = ns
            state.kv_bytes_per_token = b.kv_bytes_per_token
            state.max_model_len = b.max_model_len
            state.generation_defaults = b.generation_defaults and b.generation_defaults.model_dump()
        old = state.registry.workers.get(b.worker_id)
        if old is not None and (old.url == b.url and state.pids.get(b.worker_id) != b.pid
                                or old.url != b.url and not await answers(old.url)):
            state.remove(b.worker_id, "replaced")   # a restart of a worker that died silently
        try:
            state.registry.register(b.worker_id, b.role, b.url, time.monotonic(),
                                    b.events_endpoint, b.replay_endpoint, b.max_num_seqs, b.kv_capacity_tokens,
                                    b.overlaps_loads, b.prefill_chunk_tokens,
                                    b.generation_defaults.max_tokens if b.generation_defaults else None)
        except ValueError as e:
            raise APIError(409, str(e), param="worker_id") from e
        state.namespaces.add(b.worker_id, b.role, ns, b.engine)   # after a restart's removal above, which forgets it
        state.registrations[b.worker_id] = b
        state.fit_admission()
        if state.gone.get(b.worker_id) is None or state.gone[b.worker_id].is_set():
            state.gone[b.worker_id] = asyncio.Event()   # a fresh life: nothing waits on it yet
        if b.events_endpoint:
            state.subscribe(b.worker_id, b.events_endpoint, b.replay_endpoint or b.events_endpoint)
        state.pids[b.worker_id] = b.pid

    return register

"""Router ↔ router: the reports active-active routers send each other, and a starting
router's first look at the fleet (the bookkeeping is ``routing/peers.py``).

Every ``every_s`` each router posts its :class:`PeerState` to every ``--peer``; a peer that
does not answer is simply not counted until it reports again. A router that starts reads
its peers' registrations once (``GET /internal/peer/workers``) and follows those workers at
once — their KV snapshot, then their events — instead of waiting for each worker's next
heartbeat to find it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable

import httpx
from fastapi import FastAPI

from warmpath.protocol.internal import PeerLoad, PeerState, PeerTurn, PeerWorkers, Registration
from warmpath.protocol.openapi import BODY, errors
from warmpath.routing.load import WorkerLoad
from warmpath.routing.peers import PeerReport

log = logging.getLogger(__name__)


def peer_state(state, turns: list | None = None) -> PeerState:
    """This router's report to the others: its load per worker, admission, index, event
    positions, and ``turns`` (the session turns ended here since the last report)."""
    with state.lock:
        sizes = state.index.sizes()
        loads = {w: PeerLoad(prefill_tokens=x.prefill_tokens, running=x.running, prefilling=x.prefilling,
                             context_tokens=x.context_tokens)
                 for w, x in list(state.load.load.items()) if w in state.registry.workers}
    return PeerState(router=state.cfg.url, loads=loads, in_flight=state.admission.in_flight,
                     waiting=state.admission.waiting(), index_blocks=sizes,
                     event_seqs={w: sub.next_seq for w, (sub, _) in list(state.subs.items())},
                     turns=[PeerTurn(session=sid, decode=d, context_tokens=c, turns=n) for sid, d, c, n in turns or ()])


def note_peer(state, b: PeerState, now: float) -> None:
    """Record another router's report; refit admission when the number of routers changed."""
    loads = {w: WorkerLoad(x.prefill_tokens, x.running, 0, x.prefilling, x.context_tokens)
             for w, x in b.loads.items()}
    state.peers.note(b.router, PeerReport(now, loads, b.in_flight, b.waiting, dict(b.index_blocks),
                                          dict(b.event_seqs)))
    for t in b.turns:   # its sessions' turns: the next one goes where this one's KV is, whichever router gets it
        state.sessions.adopt(t.session, t.decode if t.decode in state.registry.workers else None,
                             t.context_tokens, t.turns, now)
    share_limit(state, now)


def share_limit(state, now: float) -> None:
    """Admit this router's share of the fleet limit: 1 / the routers alive now."""
    n = state.peers.routers(now)
    if n != state.admission.routers:
        log.info("routers sharing the fleet: %d -> %d", state.admission.routers, n)
        state.admission.routers = n
        state.fit_admission()


async def peer_loop(state, http: httpx.AsyncClient) -> None:
    """Post this router's report to every peer every ``every_s``; notice peers that went silent."""
    cfg = state.cfg.peers

    async def post(url: str, body: dict) -> None:
        try:
            await http.post(url + "/internal/peer", json=body, timeout=cfg.every_s * 2)
        except httpx.HTTPError:
            pass   # a dead or restarting peer: it stops counting after alive_s

    while True:
        try:
            turns = [state.turns_out.popleft() for _ in range(len(state.turns_out))]
            body = peer_state(state, turns).model_dump()
            await asyncio.gather(*(post(u, body) for u in cfg.peers))
            share_limit(state, time.monotonic())
        except Exception:  # noqa: BLE001 - the loop that shares the limit must not die
            log.exception("peer report failed")
            state.metrics.thread_errors.labels("peers").inc()
        await asyncio.sleep(cfg.every_s)


async def adopt_peer_workers(state, http: httpx.AsyncClient,
                             register: Callable[[Registration], Awaitable[None]]) -> int:
    """Register the workers the peers know (once, at start); returns how many were new here."""
    new = 0
    for url in state.cfg.peers.peers:
        try:
            r = await http.get(url + "/internal/peer/workers", timeout=2.0)
            got = PeerWorkers.model_validate_json(r.content).workers if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError) as e:
            log.info("peer %s: no workers read (%s)", url, e)
            continue
        for b in got:
            if b.worker_id in state.registry.workers:
                continue
            try:
                await register(b)
                new += 1
            except Exception as e:  # noqa: BLE001 - one bad registration must not stop the rest
                log.warning("worker %s from peer %s not adopted: %s", b.worker_id, url, e)
    return new


def add_peer_routes(app: FastAPI, state, internal: list) -> None:
    """``POST /internal/peer`` and ``GET /internal/peer/workers`` (the cluster token required)."""

    @app.post("/internal/peer", dependencies=internal, responses=errors(*BODY))
    async def peer(b: PeerState) -> dict:
        note_peer(state, b, time.monotonic())
        return {"ok": True}

    @app.get("/internal/peer/workers", dependencies=internal, responses=errors(401))
    async def workers() -> PeerWorkers:
        live = [b for w, b in list(state.registrations.items()) if w in state.registry.workers]
        return PeerWorkers(workers=live)


def routers_json(state, now: float, full: bool) -> dict:
    """``/v1/cluster``'s ``routers`` (this one first, then every peer heard from) and whether
    the routers alive agree: the same blocks indexed from events (``local``, ``l3``; each
    router's ``approx`` hints are its own) and the same event position per worker.
    ``full``: with this router's PID and the routers' URLs (a trusted caller)."""
    me = peer_state(state)
    mine = {"url": me.router, "self": True, "alive": True, "pid": os.getpid() if full else None,
            "in_flight": me.in_flight, "waiting": me.waiting,
            "index_blocks": dict(me.index_blocks), "event_seqs": dict(me.event_seqs)}
    peers = state.peers.to_json(now)
    alive = [p for p in peers if p["alive"]]
    def evented(blocks: dict) -> tuple:
        return blocks.get("local"), blocks.get("l3")
    agree = all(evented(p["index_blocks"]) == evented(mine["index_blocks"]) and p["event_seqs"] == mine["event_seqs"]
                for p in alive)
    out = [mine, *peers]
    if not full:   # internal addresses: named by position for an untrusted caller, as worker URLs are withheld
        out = [{**r, "url": f"router-{i}"} for i, r in enumerate(out)]
    return {"routers": out, "routers_agree": agree}

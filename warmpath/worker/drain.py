"""Graceful termination: a worker's first SIGTERM drains it instead of stopping it at once.

The drain, in order: ``/ready`` answers 503 ``draining``; the router is told at once (a
heartbeat with ``draining=True``: it routes nothing new here but leaves the requests under
way alone, and answers how many it still has for this worker, counting prefills elsewhere
whose decode will come here); the worker keeps serving, asking the router again every
``poll_s``, until neither it nor the router has had a request open for ``settle_s``, at
most ``timeout_s``; then it tells the router it left (``healthy=False, draining=True``:
dropped as ``drained``) and uvicorn shuts down as usual (exit code 0). A router that cannot
be reached counts as having nothing. A second SIGTERM or a SIGINT stops at once. Kubernetes' ``terminationGracePeriodSeconds``
must exceed ``timeout_s`` (``warmpath manifests`` sets it so).

NOTE: no torch; the counting middleware sees every HTTP request but the probes and metrics.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import uvicorn

log = logging.getLogger(__name__)

UNCOUNTED = ("/health", "/ready", "/metrics")


class InFlight:
    """ASGI middleware: how many HTTP requests are being answered now (a streamed answer
    counts until its last chunk went out); probes and ``/metrics`` are not counted."""

    def __init__(self, app) -> None:
        self.app, self.count = app, 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED:
            return await self.app(scope, receive, send)
        self.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.count -= 1


@dataclass
class Drain:
    """One worker's drain: its settings and where it stands (``active`` once SIGTERM came,
    ``done`` once it may leave)."""

    timeout_s: float = 120.0
    settle_s: float = 1.0
    poll_s: float = 0.5
    active: bool = False
    done: bool = False
    drained: bool | None = field(default=None, init=False)   # None until it ends; False: timed out

    def __post_init__(self) -> None:
        if self.timeout_s < 0 or self.settle_s < 0 or self.poll_s <= 0:
            raise ValueError(f"drain: need timeout, settle >= 0 and poll > 0, got "
                             f"{self.timeout_s} / {self.settle_s} / {self.poll_s}")

    async def run(self, in_flight: Callable[[], int], tell: Callable[[bool], Awaitable[int | None]]) -> bool:
        """Drain: ``tell(False)`` (draining; returns the router's count for this worker, or
        ``None``), wait until ``in_flight()`` and that count stayed 0 for ``settle_s`` (at
        most ``timeout_s``), ``tell(True)`` (left); ``True`` when nothing was left open."""
        self.active = True
        t0 = time.monotonic()
        log.warning("SIGTERM: draining (at most %.0f s); no new requests are routed here", self.timeout_s)
        routed, asked = await _quietly(tell(False)), time.monotonic()
        idle_since = None
        while True:
            now = time.monotonic()
            if now - asked >= self.poll_s:
                routed, asked = await _quietly(tell(False)), time.monotonic()
            if in_flight() == 0 and not routed:
                idle_since = now if idle_since is None else idle_since
                if now - idle_since >= self.settle_s:
                    self.drained = True
                    break
            else:
                idle_since = None
            if now - t0 >= self.timeout_s:
                self.drained = False
                log.error("drain timed out after %.0f s with %d request(s) open here, %s at the router",
                          self.timeout_s, in_flight(), routed)
                break
            await asyncio.sleep(0.05)
        self.done = True
        await _quietly(tell(True))
        log.warning("drained in %.1f s; stopping", time.monotonic() - t0)
        return self.drained


async def _quietly(aw: Awaitable[int | None]) -> int | None:
    """Await ``aw``; a router that cannot be told is no reason not to drain (``None``)."""
    try:
        return await aw
    except Exception:   # best effort: the router also drops silent workers
        log.exception("could not tell the router about the drain")
        return None


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose first SIGTERM runs ``drain`` (then exits cleanly, no signal
    re-raised); any other signal, or a second SIGTERM, is uvicorn's usual stop."""

    def __init__(self, config: uvicorn.Config, drain: Drain, in_flight: InFlight,
                 tell: Callable[[bool], Awaitable[int | None]]) -> None:
        super().__init__(config)
        self.drain, self.in_flight, self.tell = drain, in_flight, tell
        self._task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame) -> None:
        if sig != signal.SIGTERM or self.drain.active or self.should_exit:
            return super().handle_exit(sig, frame)
        loop = asyncio.get_running_loop()   # the handler runs on the loop's (main) thread
        loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        async def drain_then_exit() -> None:
            try:
                await self.drain.run(lambda: self.in_flight.count, self.tell)
            finally:
                self.should_exit = True

        if not self.drain.active:
            self.drain.active = True   # a second SIGTERM from here on stops at once
            self._task = asyncio.ensure_future(drain_then_exit())

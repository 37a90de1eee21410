"""Runs an :class:`LLMEngine` on a background thread for asyncio servers."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from warmpath.engine.llm_engine import LLMEngine
from warmpath.engine.request_output import RequestOutput
from warmpath.engine.sequence import SamplingParams

log = logging.getLogger(__name__)


class RequestFailed(RuntimeError):
    """This request alone failed inside the engine; the engine goes on."""


class EngineFailed(RuntimeError):
    """The engine thread stopped (an error no single request caused); nothing it held
    produced output after this, so its unfinished requests may be retried elsewhere."""


class InjectedCrash(RuntimeError):
    """Raised on the engine thread by :meth:`AsyncEngine.inject_crash` (tests, chaos)."""


@dataclass
class RequestHandle:
    """The asyncio side of one request: outputs arrive on ``queue``."""

    request_id: str
    queue: "asyncio.Queue[RequestOutput | Exception]"


class AsyncEngine:
    """Thread-safe front of an engine.

    The engine thread owns the engine; the event loop only sends commands
    (add / abort) through a thread-safe queue and receives outputs through
    per-request asyncio queues. ``on_step`` (if given) is called on the engine
    thread after each step with the step's outputs (metrics hook).

    A request whose own data makes a step fail gets :class:`RequestFailed` and the engine
    goes on; an error no request caused stops the thread: every waiting request gets
    :class:`EngineFailed`, ``alive`` turns false and ``dead`` (an asyncio event of the loop
    that called :meth:`start`) is set, so the server can report itself and exit.
    """

    def __init__(self, engine: LLMEngine,
                 on_step: Callable[[list[RequestOutput]], None] | None = None) -> None:
        self.engine = engine
        self._cmds: "queue.Queue[tuple]" = queue.Queue()
        self._handles: dict[str, tuple[asyncio.AbstractEventLoop, RequestHandle]] = {}
        self._on_step = on_step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="warmpath-engine", daemon=True)
        self.error: BaseException | None = None
        self.dead: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Start the engine thread (call from the event loop that serves requests)."""
        try:
            self._loop = asyncio.get_running_loop()
            self.dead = asyncio.Event()
        except RuntimeError:
            self._loop = None
        self._thread.start()

    def inject_crash(self) -> None:
        """Make the engine thread fail as an engine bug would (fault injection)."""
        self._cmds.put(("crash",))

    def shutdown(self) -> None:
        self._stop.set()
        self._cmds.put(("noop",))
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams,
                    cache_salt: str | None = None, output_prefix: list[int] | None = None
                    ) -> RequestHandle:
        """Queue a request (validate it with ``engine.check_prompt`` first);
        ``output_prefix``: tokens generated elsewhere (see ``LLMEngine.add_request``).

        When the prefix cannot end the request, its output is delivered right away from
        this thread (a handed-off first token must not wait for the engine's current step).
        """
        loop = asyncio.get_running_loop()
        handle = RequestHandle(request_id, asyncio.Queue())
        self._handles[request_id] = (loop, handle)
        early = self.engine.early_prefix_output(request_id, len(prompt), params, output_prefix)
        if early is not None:
            handle.queue.put_nowait(early)
        self._cmds.put(("add", request_id, prompt, params, cache_salt, output_prefix, early is not None))
        # The engine thread may have died between the caller's ``alive`` check and now, after
        # it failed the handles it knew: whoever pops the handle first delivers the failure.
        if self.error is not None and self._handles.pop(request_id, None) is not None:
            handle.queue.put_nowait(EngineFailed(f"engine failed: {type(self.error).__name__}: {self.error}"))
        return handle

    def abort(self, request_id: str) -> None:
        """Abort a request (safe to call for finished or unknown ids)."""
        if self._handles.pop(request_id, None) is not None:
            self._cmds.put(("abort", request_id))

    # -- engine thread -----------------------------------------------------
    def _deliver(self, rid: str, item: RequestOutput | Exception, last: bool) -> None:
        entry = self._handles.pop(rid, None) if last else self._handles.get(rid)
        if entry is not None:
            loop, handle = entry
            loop.call_soon_threadsafe(handle.queue.put_nowait, item)

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, rid, prompt, params, salt, prefix, reported = cmd
            if rid not in self._handles:
                return  # aborted before it reached the engine
            try:
                self.engine.add_request(prompt, params, request_id=rid, cache_salt=salt,
                                        output_prefix=prefix)
            except ValueError as e:
                self._deliver(rid, e, last=True)
                return
            except Exception as e:  # noqa: BLE001 - this request alone; add_request left no trace
                log.exception("request %s failed on admission", rid)
                self._deliver(rid, RequestFailed(f"{type(e).__name__}: {e}"), last=True)
                return
            first = self.engine.take_initial_output(rid)
            if first is not None and not reported:
                self._deliver(rid, first, last=first.finished)
        elif cmd[0] == "abort":
            self.engine.abort(cmd[1])
        elif cmd[0] == "crash":
            raise InjectedCrash("injected engine crash")

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                block = not self.engine.has_work()
                try:
                    cmd = self._cmds.get(block=block, timeout=0.5 if block else None)
                    self._apply(cmd)
                    while True:
                        self._apply(self._cmds.get_nowait())
                except queue.Empty:
                    pass
                if not self.engine.has_work():
                    self.engine.idle()
                    continue
                outputs = self.engine.step()
                if self._on_step is not None:
                    self._on_step(outputs)
                for o in outputs:
                    if o.error is not None:
                        log.error("request %s failed in the engine: %s", o.request_id, o.error)
                    self._deliver(o.request_id, o if o.error is None else RequestFailed(o.error),
                                  last=o.finished)
        except BaseException as e:  # noqa: BLE001 - report to every waiting request
            log.exception("engine thread crashed")
            self.error = e
            for rid in list(self._handles):
                self._deliver(rid, EngineFailed(f"engine failed: {type(e).__name__}: {e}"), last=True)
            if self._loop is not None and self.dead is not None:
                try:
                    self._loop.call_soon_threadsafe(self.dead.set)
                except RuntimeError:   # the loop is closed: nobody is waiting
                    pass

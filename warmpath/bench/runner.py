"""Drive a target with sessions at given arrival times (or a fixed concurrency)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import httpx
from httpx_sse import aconnect_sse

from warmpath.bench.metrics import Record, client_timeout_error
from warmpath.bench.prom import warmpath_totals
from warmpath.bench.requests_log import route_from_http
from warmpath.bench.reuse import PrefixOverlap, block_hashes, measured_class
from warmpath.bench.workload import Session, tokens


@dataclass
class Answer:
    """What one request returned."""

    ok: bool
    ttft: float | None = None
    e2e: float | None = None
    text: str = ""
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None      # None: the server did not report it
    itls: list[float] | None = None
    error: str | None = None
    route: dict | None = None             # the path it took (``requests_log.route_from_http``)


class BenchTarget(ABC):
    """Something that answers prompts: an HTTP server, or the simulator."""

    @abstractmethod
    async def complete(self, prompt: list[int], max_tokens: int, session_id: str) -> Answer:
        """Send one prompt (token ids); return timings measured from the send. (A session with
        a tenant or a priority is sent with ``tenant=`` / ``priority=`` keywords too: a target
        that serves tenants takes them.)"""

    async def server_metrics(self) -> dict[str, float]:
        """Counters the target exposes (for hit ratios); empty when it has none."""
        return {}

    async def close(self) -> None:
        pass


class _Stream:
    """One streamed completion as its events arrive: TTFT is the first event carrying text."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.first: float | None = None
        self.last: float | None = None
        self.parts: list[str] = []
        self.itls: list[float] = []
        self.usage: dict = {}

    def add(self, d: dict) -> str | None:
        """Take one event's JSON; returns the error it reports, if it is an error event."""
        if d.get("error"):
            e = d["error"]
            return "stream error: " + (e.get("message", "") if isinstance(e, dict) else str(e))
        if d.get("usage"):
            self.usage = d["usage"]
        for c in d.get("choices") or []:
            if c.get("text"):
                now = time.perf_counter()
                if self.first is None:
                    self.first = now
                else:
                    self.itls.append(now - self.last)
                self.last = now
                self.parts.append(c["text"])
        return None

    def answer(self, prompt_len: int) -> Answer:
        """The request as it ended now (a stream with no text: TTFT = E2E)."""
        end = time.perf_counter()
        first = end if self.first is None else self.first
        u = self.usage
        details = u.get("prompt_tokens_details") or {}
        return Answer(True, first - self.t0, end - self.t0, "".join(self.parts),
                      u.get("completion_tokens") or len(self.parts), u.get("prompt_tokens", prompt_len),
                      details.get("cached_tokens"), self.itls)


@dataclass(frozen=True)
class Deadline:
    """The client's own timeout for one request when ``--timeout`` is not given: ``base_s``
    plus ``per_output_s`` per answer token asked (``max_tokens``) plus ``per_prompt_s`` per
    prompt token, so that it fits the workload it drives: a fixed 30 s cut multi-turn-chat's
    long answers (up to 1,024 tokens) at a CPU's 133 ms TPOT (5 of 17 requests, issue 53).
    0.5 s per token is ~4x that TPOT; 0.01 s per prompt token, 100 tokens/s of prefill,
    a tenth of a 2-core CPU's."""

    base_s: float = 30.0
    per_output_s: float = 0.5
    per_prompt_s: float = 0.01

    def __call__(self, prompt_tokens: int, max_tokens: int) -> float:
        """Seconds from the send within which the answer must have ended."""
        return self.base_s + self.per_output_s * max_tokens + self.per_prompt_s * prompt_tokens

    def describe(self) -> str:
        return (f"per request: {self.base_s:g} s + {self.per_output_s:g} s per answer token asked "
                f"+ {self.per_prompt_s:g} s per prompt token")


DEADLINE = Deadline()


def timeout_text(timeout_s: float | None) -> str:
    """What a run's client timeout was, in words (``None``: :data:`DEADLINE`)."""
    return DEADLINE.describe() if timeout_s is None else f"{timeout_s:g} s"


class OpenAITarget(BenchTarget):
    """Any OpenAI-compatible server: streaming ``/v1/completions`` with token-id prompts."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float | None = None,
                 decode: Callable[[list[int]], str] | None = None, api_key: str | None = None,
                 deadline: Deadline = DEADLINE) -> None:
        """``decode`` given: prompts are sent as text (for servers without token-id prompts);
        ``api_key``: sent as ``Authorization: Bearer`` (servers started with API keys);
        ``timeout_s``: the client's timeout of every request (``None``: ``deadline``'s,
        fitted to each request's lengths)."""
        self.url = url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.decode = decode
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s or deadline.base_s, connect=5.0),
                                      limits=httpx.Limits(max_connections=2000, max_keepalive_connections=200),
                                      headers={"Authorization": f"Bearer {api_key}"} if api_key else None)

    def deadline_s(self, prompt_tokens: int, max_tokens: int) -> float:
        """This request's timeout: ``timeout_s``, else ``deadline``'s for its lengths."""
        return self.timeout_s if self.timeout_s is not None else self.deadline(prompt_tokens, max_tokens)

    async def resolve_model(self) -> str:
        if self.model is None:
            r = await self.http.get(self.url + "/v1/models")
            r.raise_for_status()
            self.model = r.json()["data"][0]["id"]
        return self.model

    async def complete(self, prompt: list[int], max_tokens: int, session_id: str, tenant: str = "default",
                       priority: int = 0) -> Answer:
        """One streamed completion; a ``tenant`` other than ``default`` goes as ``X-Tenant-Id``
        (a router without API keys takes it), a ``priority`` as the body's field."""
        body = {"model": await self.resolve_model(),
                "prompt": self.decode(prompt) if self.decode else prompt, "max_tokens": max_tokens,
                # plain greedy whatever the server's defaults (SmolLM2's repetition penalty)
                "temperature": 0, "repetition_penalty": 1.0, "stream": True, "ignore_eos": True, "user": session_id,
                "stream_options": {"include_usage": True}}
        if priority:
            body["priority"] = priority
        headers = {"X-Tenant-Id": tenant} if tenant != "default" else {}
        stream = _Stream(time.perf_counter())
        limit = self.deadline_s(len(prompt), max_tokens)
        try:
            async with asyncio.timeout(limit):
                async with aconnect_sse(self.http, "POST", self.url + "/v1/completions", json=body, headers=headers,
                                        timeout=httpx.Timeout(limit, connect=min(5.0, limit))) as es:
                    r = es.response
                    if r.status_code != 200:
                        return Answer(False, error=f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                    async for ev in es.aiter_sse():
                        if ev.data == "[DONE]":
                            break
                        if ev.data and (err := stream.add(json.loads(ev.data))):
                            return Answer(False, error=err)
        except (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
            return Answer(False, error=client_timeout_error(limit))
        except httpx.HTTPError as e:
            return Answer(False, error=f"{type(e).__name__}: {e}")
        a = stream.answer(len(prompt))
        a.route = route_from_http(r.headers, stream.usage)
        return a

    async def server_metrics(self) -> dict[str, float]:
        """The ``warmpath_*`` totals of ``/metrics``; empty when the target has no such page
        (a peer router answers 404 with a JSON body) or it is not Prometheus text."""
        try:
            r = await self.http.get(self.url + "/metrics", timeout=5)
            return warmpath_totals(r.text) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    async def close(self) -> None:
        await self.http.aclose()


Encoder = Callable[[str], list[int]]


async def run_session(target: BenchTarget, s: Session, t0: float, records: list[Record],
                      encode: Encoder | None, seed: int, on_done: Callable[[], None],
                      slots: asyncio.Semaphore | None = None, seen: PrefixOverlap | None = None) -> None:
    """Wait for the session's start, then send its turns in order, growing the history.
    ``slots``: the client-side concurrency cap (a turn waits for one before it is sent;
    its TTFT is timed from the send). ``seen``: the prompts sent so far (the overlap
    fallback of the cold / warm rule and a trace row's turn)."""
    delay = t0 + s.start - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    history = list(s.prefix)
    rng = random.Random(f"{seed}-{s.sid}")
    seen = seen if seen is not None else PrefixOverlap()
    for i, turn in enumerate(s.turns):
        history += turn.new_tokens
        ready = time.perf_counter()
        if slots is not None:
            await slots.acquire()
        try:
            sent = time.perf_counter()
            ov = seen.observe(block_hashes(history), len(history), i + 1 if i else None)
            who = {"tenant": s.tenant, "priority": s.priority} if (s.tenant, s.priority) != ("default", 0) else {}
            a = await target.complete(history, turn.max_tokens, s.sid, **who)
        finally:
            if slots is not None:
                slots.release()
        cls, how = measured_class(a.prompt_tokens or len(history), a.cached_tokens, ov.tokens)
        records.append(Record(s.sid, ov.turn, cls, a.ok, a.ttft, a.e2e, a.output_tokens,
                              a.prompt_tokens, a.cached_tokens or 0, a.itls or [], a.error,
                              sent - ready, how, a.route or {}, s.tenant, s.priority))
        on_done()
        if not a.ok:
            return
        # The answer joins the history (re-tokenized when we can, else same-length filler).
        history += encode(a.text) if encode and a.text else tokens(rng, a.output_tokens)


async def run(target: BenchTarget, sessions: list[Session], concurrency: int | None = None,
              encode: Encoder | None = None, seed: int = 0,
              progress: Callable[[int, int], None] | None = None,
              stop_after_s: float | None = None,
              max_concurrency: int | None = None) -> tuple[list[Record], float]:
    """Run all sessions; returns records and the wall time. ``concurrency`` switches from
    timed arrivals to a closed loop of that many sessions in flight, starting no new
    session after ``stop_after_s``. ``max_concurrency``: at most that many requests in
    flight, the others waiting in the client (TTFT timed from the send)."""
    records: list[Record] = []
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    seen = PrefixOverlap()
    total = sum(len(s.turns) for s in sessions)
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress:
            progress(done[0], total)

    t0 = time.perf_counter()
    if concurrency:
        queue = list(sessions)

        async def worker() -> None:
            while queue and (stop_after_s is None or time.perf_counter() - t0 < stop_after_s):
                s = queue.pop(0)
                s.start = 0.0
                await run_session(target, s, t0, records, encode, seed, tick, slots, seen)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    else:
        await asyncio.gather(*(run_session(target, s, t0, records, encode, seed, tick, slots, seen)
                               for s in sessions))
    return records, time.perf_counter() - t0

"""The chaos run's load and its checks (``benchmarks/reliability/chaos.py``): coding-agent sessions
through ``warmpath.bench.runner`` with a target that keeps every request (prompt ids, text,
timings, the workers that served it, where it failed), and the single-engine greedy answer
each completed request must equal."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import threading
import time
from dataclasses import asdict, dataclass, field

import httpx
from httpx_sse import aconnect_sse

from warmpath.bench import runner
from warmpath.bench.workload import coding_agent


@dataclass
class Sent:
    """One request as the client saw it (times: ``time.monotonic()``)."""

    sid: str
    prompt: list[int] = field(repr=False)
    max_tokens: int
    sent: float
    first: float | None = None
    end: float | None = None
    text: str = ""
    worker: str | None = None        # X-Warmpath-Worker: the prefill worker (or the decode one)
    decode: str | None = None        # X-Warmpath-Decode
    router: str | None = None        # X-Warmpath-Router (serve --routers N: HAProxy names the router)
    cached: int | None = None        # prompt tokens found cached (the answer's usage)
    output_tokens: int = 0
    failed: str | None = None        # None | "before_first" | "mid_stream_clean" | "mid_stream_unclean"
    error: str | None = None


class ChaosTarget(runner.OpenAITarget):
    """``OpenAITarget`` that records each request in :attr:`log`."""

    def __init__(self, url: str, timeout_s: float) -> None:
        super().__init__(url, None, timeout_s)
        self.log: list[Sent] = []

    async def complete(self, prompt: list[int], max_tokens: int, session_id: str) -> runner.Answer:
        body = {"model": await self.resolve_model(), "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "repetition_penalty": 1.0, "stream": True, "ignore_eos": True,
                "user": session_id, "stream_options": {"include_usage": True}}
        s = Sent(session_id, list(prompt), max_tokens, time.monotonic())
        self.log.append(s)
        stream, done = runner._Stream(time.perf_counter()), False
        try:
            async with asyncio.timeout(self.timeout_s):
                async with aconnect_sse(self.http, "POST", self.url + "/v1/completions", json=body) as es:
                    r = es.response
                    s.worker, s.decode = r.headers.get("x-warmpath-worker"), r.headers.get("x-warmpath-decode")
                    s.router = r.headers.get("x-warmpath-router")
                    if r.status_code != 200:
                        return self._fail(s, "before_first", f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                    async for ev in es.aiter_sse():
                        if ev.data == "[DONE]":
                            done = True
                            break
                        if not ev.data:
                            continue
                        err = stream.add(json.loads(ev.data))
                        if s.first is None and stream.first is not None:
                            s.first = time.monotonic()
                        if err:
                            return self._fail(s, "mid_stream_clean" if s.first else "before_first", err)
        except (TimeoutError, httpx.HTTPError, ValueError) as e:
            return self._fail(s, "mid_stream_unclean" if s.first else "before_first", f"{type(e).__name__}: {e}")
        if not done:
            return self._fail(s, "mid_stream_unclean" if s.first else "before_first", "stream ended without [DONE]")
        s.end, a = time.monotonic(), stream.answer(len(prompt))
        s.text, s.cached, s.output_tokens = a.text, a.cached_tokens, a.output_tokens
        return a

    @staticmethod
    def _fail(s: Sent, where: str, error: str) -> runner.Answer:
        s.end, s.failed, s.error = time.monotonic(), where, error
        return runner.Answer(False, error=error)


class Load:
    """Sessions arriving at ``rate`` per second for ``duration`` seconds, on a thread."""

    def __init__(self, url: str, rate: float, duration: float, seed: int, scale: float, timeout_s: float) -> None:
        rng = random.Random(seed)
        n = max(1, int(rate * duration))
        self.sessions = coding_agent(n, seed, scale=scale)
        t = 0.0
        for s in self.sessions:
            t += rng.expovariate(rate)
            s.start = t
        self.sessions = [s for s in self.sessions if s.start < duration]
        self.target = ChaosTarget(url, timeout_s)
        self.seed = seed
        self.thread = threading.Thread(target=self._main, name="chaos-load", daemon=True)

    def _main(self) -> None:
        from warmpath.models.files import load_tokenizer

        encode = functools.partial(load_tokenizer().encode, add_special=False)

        async def go() -> None:
            try:
                await runner.run(self.target, self.sessions, encode=encode, seed=self.seed)
            finally:
                await self.target.close()

        asyncio.run(go())

    def start(self) -> "Load":
        self.thread.start()
        return self

    def served_by(self, worker: str, after: float) -> float | None:
        """When the first request through ``worker`` sent after ``after`` got its first token."""
        ts = [s.first for s in list(self.target.log) if s.sent >= after and s.first is not None
              and not s.failed and worker in (s.worker, s.decode)]
        return min(ts) if ts else None

    def first_ok(self, after: float) -> float | None:
        """When the first request sent after ``after`` that ended well got its first token."""
        ts = [s.first for s in list(self.target.log) if s.sent >= after and s.end and not s.failed]
        return min(ts) if ts else None


def references(log: list[Sent], batch: int = 8) -> list[str]:
    """The single-engine greedy answer of every completed request (the model and mode the
    workers serve: ``--quantization auto``), in ``log`` order (``""`` for failed ones)."""
    from warmpath.engine.llm_engine import EngineConfig, LLMEngine
    from warmpath.engine.sequence import SamplingParams
    from warmpath.models.loader import load_model

    loaded = load_model("smollm2", quantization="auto")
    eng = LLMEngine(EngineConfig(), loaded=loaded)
    tok = eng.tokenizer
    out = [""] * len(log)
    todo = [i for i, s in enumerate(log) if not s.failed]
    for k in range(0, len(todo), batch):
        idx = todo[k:k + batch]
        for m in {log[i].max_tokens for i in idx}:
            same = [i for i in idx if log[i].max_tokens == m]
            params = SamplingParams(max_tokens=m, temperature=0.0, repetition_penalty=1.0, ignore_eos=True)
            for i, ids in zip(same, eng.generate([log[i].prompt for i in same], params)):
                out[i] = tok.decode(ids, skip_special=True)
    return out


def tally(log: list[Sent], refs: list[str], t0: float) -> dict:
    """Counts, and every wrong answer and failure in words (times from ``t0``)."""
    wrong = [{"sid": s.sid, "sent_s": round(s.sent - t0, 2), "worker": s.worker, "decode": s.decode,
              "got": s.text, "want": r} for s, r in zip(log, refs) if not s.failed and s.text != r]
    fails = [{"sid": s.sid, "sent_s": round(s.sent - t0, 2), "end_s": round((s.end or s.sent) - t0, 2),
              "where": s.failed, "worker": s.worker, "decode": s.decode, "error": (s.error or "")[:300]}
             for s in log if s.failed]
    by = lambda w: sum(1 for s in log if s.failed == w)   # noqa: E731
    return {"sent": len(log), "completed": sum(1 for s in log if not s.failed),
            "failed_before_first_token": by("before_first"), "failed_mid_stream_clean": by("mid_stream_clean"),
            "failed_mid_stream_unclean": by("mid_stream_unclean"), "wrong_answers": len(wrong),
            "wrong": wrong, "failures": fails}


def dump_log(log: list[Sent], t0: float) -> list[dict]:
    """The requests without their prompts (for the JSON), times from ``t0``."""
    rows = []
    for s in log:
        d = asdict(s)
        d.pop("prompt")
        d["prompt_tokens"] = len(s.prompt)
        for k in ("sent", "first", "end"):
            d[k] = None if d[k] is None else round(d[k] - t0, 3)
        rows.append(d)
    return rows

"""The benchmark client's side of a simulation: the client-side concurrency cap, and what
classes each request (``bench/reuse.py``, the rule ``warmpath bench`` uses).

Under a cap of ``N`` (``--max-concurrency N``, as ``vllm bench serve``) at most ``N``
requests are in flight — sent, not yet answered or failed — and the others wait in the
client, first come first served; a request's TTFT is timed from its send. Without a cap
each request is sent when it arrives. With a timeout (``--timeout``, as ``warmpath bench``'s
client: the whole answer within it of the send) a request still unanswered then fails
(``TimeoutError``) and the cluster abandons it (``Simulation._abandon``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from warmpath.bench.metrics import Record
from warmpath.bench.reuse import Overlap, PrefixOverlap, measured_class
from warmpath.bench.workload import Session
from warmpath.routing.views import Decision, RequestView


@dataclass
class Req:
    """One turn of a session in flight (``arrival``: its send)."""

    rid: str
    session: Session
    turn: int
    prompt: list[int]
    arrival: float
    rv: RequestView
    decision: Decision | None = None
    admitted: float = 0.0
    first_at: float | None = None
    output: list[int] = field(default_factory=list)
    cached: int = 0
    hashes: list[bytes] | None = None    # block hashes of prompt + output once finished
    overlap: Overlap = Overlap(0, 1)     # its prefix overlap with earlier prompts, its turn
    client_wait: float = 0.0             # waiting in the client for a slot before its send
    kv_hashes: list[bytes] | None = None  # a remote turn's own block hashes (sim/handoff.py), else rv's
    worker_priority: int = 0              # what the workers order it by (Admission.worker_priority)
    cached_by_tier: dict | None = None   # prompt tokens by tier, as the stage that computed it found them
    ended: bool = False                  # the client recorded it (answered, failed or timed out)
    held_at: float | None = None         # when the policy first held it (``Decision.hold_s``)
    at_worker: float = 0.0               # when it reached the worker that answers it
    dec_first: float | None = None       # the decode worker's first token of it (its answer's timing)
    dec_tokens: int = 0                  # tokens that worker produced after that one
    dec_batch: float = 0.0               # summed over those: sequences sampling in the same step

    def path(self) -> dict:
        """The path it took (``bench/requests_log.ROUTE_KEYS``)."""
        d = self.decision
        if d is None:
            return {}
        return {"path": d.path, "prefill": d.prefill if d.prefill != d.decode else None, "decode": d.decode,
                "ppd": d.ppd, "cached_by_tier": self.cached_by_tier, "predicted_ttft_s": d.est_ttft_s,
                "predicted_tpot_s": d.est_tpot_s, "ppd_reason": d.ppd_reason,
                "server_timing": {"route": self.admitted - self.arrival}}   # as the router's stage: its admission wait


class SimClient:
    """Client-side slots and the prompts sent so far. ``at(t, fn, *args)`` schedules an event."""

    def __init__(self, max_concurrency: int | None, block_size: int, at: Callable,
                 timeout_s: float | None = None) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.cap, self.timeout_s = max_concurrency, timeout_s
        self.at = at
        self.in_flight = 0
        self.waiting: deque = deque()     # (ready time, send, args) in arrival order
        self.seen = PrefixOverlap(block_size)

    def arrive(self, now: float, send: Callable, *args) -> None:
        """A request is ready: ``send(*args, ready_time)`` now if a slot is free, else when one frees."""
        if self.cap is not None and self.in_flight >= self.cap:
            self.waiting.append((now, send, args))
            return
        self.in_flight += 1
        send(*args, now)

    def ended(self, now: float, req: Req, error: str | None = None) -> Record:
        """A request in flight ended (``error``: failed), as the client records it; its slot
        goes to the longest waiting. Cold or warm by what the simulated cache gave it (a failed
        request: its overlap)."""
        ok = error is None
        cls, how = measured_class(len(req.prompt), req.cached if ok else None, req.overlap.tokens)
        rec = Record(req.session.sid, req.overlap.turn, cls, ok, req.first_at - req.arrival if ok else None,
                     now - req.arrival if ok else None, len(req.output) if ok else 0, len(req.prompt),
                     req.cached if ok else 0, error=error, client_wait_s=req.client_wait, reuse=how,
                     route=req.path(), tenant=req.session.tenant, priority=req.session.priority)
        req.ended = True
        self._free(now)
        return rec

    def watch(self, now: float, req: Req, expire: Callable[[Req], None]) -> None:
        """With a timeout: ``expire(req)`` once it has passed since the send, unless it ended."""
        if self.timeout_s is not None:
            self.at(now + self.timeout_s, lambda r: None if r.ended else expire(r), req)

    def _free(self, now: float) -> None:
        self.in_flight -= 1
        if self.waiting:
            ready, send, args = self.waiting.popleft()
            self.in_flight += 1
            self.at(now, send, *args, ready)

    def observe(self, hashes: Sequence[bytes], prompt_tokens: int, turn: int | None) -> Overlap:
        """A prompt being sent, against those sent before it (``PrefixOverlap.observe``)."""
        return self.seen.observe(hashes, prompt_tokens, turn)

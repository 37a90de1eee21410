"""One request's trip through the cluster, as the router records it: where it went, when
its first token came, what each stage reported (``Server-Timing``), and its metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from warmpath.protocol.internal import PrefillReply
from warmpath.protocol.openai import SamplingFields
from warmpath.router.handoff import Handoff
from warmpath.router.metrics import RouterMetrics
from warmpath.routing.views import Decision, RequestView


@dataclass
class Trip:
    """What the router learns about one request on its way (owned by ``RequestFlow``)."""

    rv: RequestView
    ids: list[int]
    body: SamplingFields          # the client's validated request
    kind: str                     # "chat" | "text"
    arrival: float
    decision: Decision
    admitted: float = 0.0
    prefill: PrefillReply | None = None      # the prefill worker's answer (disaggregated)
    handoff: Handoff | None = None           # how it goes to the decode worker (with ``prefill``)
    ttft_s: float | None = None
    queue_s: float = 0.0
    completion_tokens: int = 0
    first_token_at: float | None = None
    timing: dict[str, float] = field(default_factory=dict)   # seconds per stage (Server-Timing)
    usage: dict | None = None     # the response's usage (with usage["warmpath"]), for the dashboard
    worker_priority: int = 0      # what the workers order it by (Admission.worker_priority)

    @property
    def cls(self) -> str:
        return self.decision.cls

    @property
    def first_token(self) -> int | None:
        """The request's first token when the prefill worker produced it (``None``: the decode
        worker computes it: no hand-off yet, or vLLM's)."""
        return self.handoff.first_token(self.prefill) if self.prefill and self.handoff else None

    def server_timing(self) -> str:
        """The ``Server-Timing`` header value (milliseconds per stage, as the spec has it)."""
        return ", ".join(f"{k};dur={v * 1000:.1f}" for k, v in self.timing.items())

    def first_token_seen(self, m: RouterMetrics, at: float, worker_queue_s: float = 0.0) -> None:
        """The first token exists at ``at`` (once): TTFT from arrival, queue = admission
        wait + the computing worker's own queue."""
        if self.ttft_s is not None:
            return
        self.first_token_at, self.ttft_s = at, at - self.arrival
        self.queue_s = (self.admitted - self.arrival) + worker_queue_s
        m.first_token(self.cls, self.ttft_s, self.queue_s)

    def prefilled(self, m: RouterMetrics, reply: PrefillReply, sent: float, handoff: Handoff) -> None:
        """Record the prefill stage's reply (TTFT here when its first token is the request's)."""
        self.prefill, self.handoff = reply, handoff
        now = time.monotonic()
        self.timing.update(prefill=now - sent, prefill_worker=reply.prefill_s, prefill_queue=reply.queue_s,
                           prefill_l3_get=reply.l3_get_s, prefill_l3_put=reply.l3_put_s)
        m.kv_bytes.inc(reply.kv_bytes)
        m.kv_put_s.inc(reply.l3_put_s)
        if self.first_token is not None:
            self.first_token_seen(m, now, reply.queue_s)

    def finished(self, m: RouterMetrics) -> float | None:
        """The last token went out: TPOT over the tokens after the first (returned)."""
        n = self.completion_tokens
        if n > 1 and self.first_token_at is not None:
            tpot = (time.monotonic() - self.first_token_at) / (n - 1)
            m.tpot.labels(self.cls).observe(tpot)
            return tpot
        return None

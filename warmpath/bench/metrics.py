"""Per-request records and their summary: percentiles, TPOT, ITL, attainment (no torch).

What a run is judged by is :class:`~warmpath.slo.Target` (``targets.py``); the
``slo`` these functions take is one, or its older flat dict / ``--slo`` string."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.slo import CLASSES, KEYS as SLO_KEYS, Target  # noqa: F401  (SLO_KEYS as before)
from warmpath.stats import percentile

SLO = Target | dict | str | None


def ttft_from(max_concurrency: int | None) -> str:
    """What TTFT is timed from: ``"send"`` under a client-side concurrency cap (a request
    waits in the client for a slot, as ``vllm bench serve --max-concurrency``), else
    ``"arrival"`` (sent when it arrives: any wait for admission is inside TTFT)."""
    return "send" if max_concurrency else "arrival"


def client_timeout_error(limit_s: float) -> str:
    """A request's error when the client gave up on it (``--timeout``): the bench's, and the
    simulator's (``sim/ending.py``), begin with ``TimeoutError``."""
    return f"TimeoutError: no answer within {limit_s:.4g} s of its send (the client's own --timeout)"


def client_timed_out(error: str | None) -> bool:
    """Whether a failure is the client's own timeout rather than the server's error."""
    return bool(error) and error.startswith("TimeoutError")


@dataclass
class Record:
    """One request as the client saw it (times in seconds from its send). ``cls``: cold or
    warm by measured reuse (``reuse.py``; ``reuse``: measured from the reported ``"cached"``
    tokens or the prefix ``"overlap"``); ``client_wait_s``: time it waited in the client for
    a slot under ``--max-concurrency`` before its send; ``route``: the path it took where the
    target reports it (``bench/requests_log.ROUTE_KEYS``)."""

    sid: str
    turn: int
    cls: str
    ok: bool
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    error: str | None = None
    client_wait_s: float = 0.0
    reuse: str = "cached"
    route: dict = field(default_factory=dict)
    tenant: str = "default"          # whom it was sent for (the session's; routing/tenants.py)
    priority: int = 0

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; 0 for a one-token answer."""
        if not self.ok or self.ttft is None or self.e2e is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0

    def classes(self) -> list[str]:
        return ["all", self.cls, "turn1" if self.turn == 1 else "turn2+"]


def parse_slo(spec: str | None) -> Target:
    """``"ttft_p90=2.0,tpot=0.2"`` (or per class, ``warm.ttft_p90=2,attain=0.9``) → the
    :class:`Target` (``Target.parse``)."""
    return Target.parse(spec)


def meets(r: Record, slo: SLO) -> bool:
    """Whether one request attained its bounds (``Target.attains``)."""
    return Target.of(slo).attains(r)


def _quantiles(name: str, xs: list[float]) -> dict[str, float | None]:
    return {f"{name}_p{q}_s": percentile(xs, q) for q in (50, 90, 99)}


def summarize(records: list[Record], duration_s: float, slo: SLO) -> dict[str, dict]:
    """Per class: completed, failed (``timed_out`` of them: the client's own timeout,
    :func:`client_timed_out`), TTFT and per-request TPOT p50/p90/p99, mean TPOT, ITL
    (mean and pooled p50/p90/p99), E2E p50, throughput, goodput, and the share of requests
    that attained the target (``attainment``; ``None`` for a class without requests)."""
    target = Target.of(slo)
    out = {}
    for c in CLASSES:
        rs = [r for r in records if c in r.classes()]
        ok = [r for r in rs if r.ok]
        ttfts = [r.ttft for r in ok]
        itls = [x for r in ok for x in r.itls]
        tpots = [r.tpot for r in ok]
        attained = sum(1 for r in rs if target.attains(r))
        out[c] = {
            "completed": len(ok), "failed": len(rs) - len(ok),
            "timed_out": sum(1 for r in rs if not r.ok and client_timed_out(r.error)),
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90),
            "ttft_p99_s": percentile(ttfts, 99), "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "tpot_s": sum(tpots) / len(tpots) if tpots else None, **_quantiles("tpot", tpots),
            "itl_s": sum(itls) / len(itls) if itls else None, **_quantiles("itl", itls),
            "e2e_p50_s": percentile([r.e2e for r in ok], 50),
            "throughput_tok_s": sum(r.output_tokens for r in ok) / duration_s if duration_s > 0 else None,
            "goodput_rps": attained / duration_s if duration_s > 0 else None,
            "attained": attained, "attainment": attained / len(rs) if rs else None,
            "success_rate": len(ok) / len(rs) if rs else None,
            "prompt_tokens": sum(r.prompt_tokens for r in ok),
            "cached_tokens": sum(r.cached_tokens for r in ok),
            "client_wait_p90_s": percentile([r.client_wait_s for r in rs], 90),
            "reuse_from_overlap": sum(1 for r in rs if r.reuse == "overlap"),
        }
    return out


def slo_met(summary: dict[str, dict], slo: SLO, min_success: float | None = None) -> bool:
    """Run-level check (``Target.met``): success share (``min_success`` overrides the
    target's), attainment shares and quantile bounds."""
    t = Target.of(slo)
    if min_success is not None:
        t = Target(t.classes, t.attain, min_success)
    return t.met(summary)


class SLOMissWatch:
    """Whether a run can no longer pass :func:`slo_met`, however its other requests end, from
    the records in so far (called with the growing list; each record is counted once), given
    that it ends with at most ``most`` records: more failures than ``1 - min_success`` of
    ``most``; more requests that did not attain their bounds than ``1 - attain`` of ``most``
    (``all``'s attainment share); or, for an ``all`` ``ttft_pXX`` limit, more completed
    requests over it than ``1 - XX%`` of ``most`` plus two (the percentile's interpolation).
    Means, medians and other classes' shares never stop a run early."""

    def __init__(self, slo: SLO, most: int, min_success: float | None = None) -> None:
        self.target = Target.of(slo)
        self.most, self.seen, self.failed, self.missed = most, 0, 0, 0
        self.min_success = self.target.min_success if min_success is None else min_success
        b = self.target.bounds("all")
        self.limits = {q: lim for q in (50, 90, 99) if b and (lim := getattr(b, f"ttft_p{q}")) is not None}
        self.over = {q: 0 for q in self.limits}

    def __call__(self, records: list[Record]) -> bool:
        for r in records[self.seen:]:
            self.failed += not r.ok
            self.missed += not self.target.attains(r)
            for q, limit in self.limits.items():
                self.over[q] += bool(r.ok and r.ttft is not None and r.ttft > limit)
        self.seen = len(records)
        if self.failed > (1 - self.min_success) * self.most:
            return True
        if self.target.judged() and self.missed > (1 - self.target.attain) * self.most + 1e-9:
            return True
        return any(n >= (1 - q / 100) * self.most + 2 for q, n in self.over.items())

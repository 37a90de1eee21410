"""Per-request records and their summary: percentiles, TPOT, ITL, goodput (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.stats import percentile

CLASSES = ("all", "cold", "warm", "turn1", "turn2+")
SLO_KEYS = ("ttft", "ttft_p50", "ttft_p90", "ttft_p99", "tpot", "itl", "e2e")


def ttft_from(max_concurrency: int | None) -> str:
    """What TTFT is timed from: ``"send"`` under a client-side concurrency cap (a request
    waits in the client for a slot, as ``vllm bench serve --max-concurrency``), else
    ``"arrival"`` (sent when it arrives: any wait for admission is inside TTFT)."""
    return "send" if max_concurrency else "arrival"


@dataclass
class Record:
    """One request as the client saw it (times in seconds from its send). ``cls``: cold or
    warm by measured reuse (``reuse.py``; ``reuse``: measured from the reported ``"cached"``
    tokens or the prefix ``"overlap"``); ``client_wait_s``: time it waited in the client for
    a slot under ``--max-concurrency`` before its send."""

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

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; 0 for a one-token answer."""
        if not self.ok or self.ttft is None or self.e2e is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0

    def classes(self) -> list[str]:
        return ["all", self.cls, "turn1" if self.turn == 1 else "turn2+"]


def parse_slo(spec: str | None) -> dict[str, float]:
    """``"ttft_p90=2.0,tpot=0.2"`` → dict; per-request keys: ttft, tpot, itl, e2e."""
    if not spec:
        return {}
    out = {}
    for part in spec.split(","):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in SLO_KEYS:
            raise ValueError(f"--slo: expected KEY=SECONDS with KEY in {', '.join(SLO_KEYS)}, got {part!r}")
        out[k] = float(v)
        if out[k] <= 0:
            raise ValueError(f"--slo: {k} must be > 0")
    return out


def meets(r: Record, slo: dict[str, float]) -> bool:
    """Whether one request met every per-request threshold (``ttft*`` apply to its TTFT)."""
    if not r.ok:
        return False
    for k, limit in slo.items():
        if k.startswith("ttft") and r.ttft > limit:
            return False
        if k == "tpot" and r.tpot > limit:
            return False
        if k == "itl" and r.itls and max(r.itls) > limit:
            return False
        if k == "e2e" and r.e2e > limit:
            return False
    return True


def summarize(records: list[Record], duration_s: float, slo: dict[str, float]) -> dict[str, dict]:
    """Per class: completed, failed, TTFT p50/p90/p99, TPOT, ITL, E2E p50, throughput, goodput."""
    out = {}
    for c in CLASSES:
        rs = [r for r in records if c in r.classes()]
        ok = [r for r in rs if r.ok]
        ttfts = [r.ttft for r in ok]
        itls = [x for r in ok for x in r.itls]
        tpots = [r.tpot for r in ok]
        out[c] = {
            "completed": len(ok), "failed": len(rs) - len(ok),
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p90_s": percentile(ttfts, 90),
            "ttft_p99_s": percentile(ttfts, 99), "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else None,
            "tpot_s": sum(tpots) / len(tpots) if tpots else None,
            "itl_s": sum(itls) / len(itls) if itls else None,
            "e2e_p50_s": percentile([r.e2e for r in ok], 50),
            "throughput_tok_s": sum(r.output_tokens for r in ok) / duration_s if duration_s > 0 else None,
            "goodput_rps": sum(1 for r in ok if meets(r, slo)) / duration_s if duration_s > 0 else None,
            "success_rate": len(ok) / len(rs) if rs else None,
            "prompt_tokens": sum(r.prompt_tokens for r in ok),
            "cached_tokens": sum(r.cached_tokens for r in ok),
            "client_wait_p90_s": percentile([r.client_wait_s for r in rs], 90),
            "reuse_from_overlap": sum(1 for r in rs if r.reuse == "overlap"),
        }
    return out


def slo_met(summary: dict[str, dict], slo: dict[str, float], min_success: float = 0.99) -> bool:
    """Run-level check: aggregate thresholds (ttft_pXX on percentiles, tpot on the mean) and success."""
    a = summary["all"]
    if a["completed"] == 0 or (a["success_rate"] or 0) < min_success:
        return False
    for k, limit in slo.items():
        val = {"ttft": a["ttft_p90_s"], "ttft_p50": a["ttft_p50_s"], "ttft_p90": a["ttft_p90_s"],
               "ttft_p99": a["ttft_p99_s"], "tpot": a["tpot_s"], "itl": a["itl_s"],
               "e2e": a["e2e_p50_s"]}[k]
        if val is None or val > limit:
            return False
    return True



class SLOMissWatch:
    """Whether a run can no longer pass :func:`slo_met`, however its other requests end, from
    the records in so far (called with the growing list; each record is counted once), given
    that it ends with at most ``most`` records: more failures than ``1 - min_success`` of
    ``most``, or, for a ``ttft_pXX`` limit, more completed requests over it than ``1 - XX%``
    of ``most`` plus two (the percentile's interpolation). Means and medians of what is still
    running never stop a run early."""

    QUANTILE = {"ttft": 90, "ttft_p50": 50, "ttft_p90": 90, "ttft_p99": 99}

    def __init__(self, slo: dict[str, float], most: int, min_success: float = 0.99) -> None:
        self.most, self.min_success, self.seen, self.failed = most, min_success, 0, 0
        self.over = {k: 0 for k in slo if k in self.QUANTILE}
        self.limits = {k: slo[k] for k in self.over}

    def __call__(self, records: list[Record]) -> bool:
        for r in records[self.seen:]:
            self.failed += not r.ok
            for k, limit in self.limits.items():
                self.over[k] += bool(r.ok and r.ttft is not None and r.ttft > limit)
        self.seen = len(records)
        if self.failed > (1 - self.min_success) * self.most:
            return True
        return any(n >= (1 - self.QUANTILE[k] / 100) * self.most + 2 for k, n in self.over.items())

"""Trace replay at a chosen load, for ``warmpath bench`` and ``warmpath sim`` alike (no torch).

A trace is replayed whole, at ``k``× its own arrival rate (``--trace-speed k``: arrival
times from the first one divided by ``k``) or at an absolute rate (``--rates R`` requests/s:
the speed that makes its mean rate ``R``). Its own rate is one over its mean gap between
arrivals: ``(n - 1) / (last - first)``. ``--duration S`` with a trace is a cap: requests
arriving ``S`` seconds or more after the first (after rescaling) are left out, and the
caller prints how many.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from warmpath.bench.workload import Session, csv_trace, mooncake_trace


def load_trace(path: Path, block: int = 512, scale: float = 1.0, max_output: int | None = None,
               seed: int = 0, salt: int = 0) -> list[Session]:
    """A Mooncake JSONL (``block`` tokens per ``hash_id``) or a CSV (arrival s, prompt
    tokens, output tokens; lengths times ``scale``) trace as one-turn sessions at the
    trace's own times. ``salt`` > 0 gives other token ids for the same shape (a new rate
    point on a server that still holds the previous point's KV)."""
    if not path.is_file():
        raise ValueError(f"--trace: file not found: {path}")
    if path.suffix == ".jsonl":
        return mooncake_trace(path, block, max_output=max_output, salt=salt)
    return csv_trace(path, seed + salt, scale)


def own_rate(trace: list[Session]) -> float:
    """Requests per second of the trace as recorded: one over its mean inter-arrival gap."""
    starts = [s.start for s in trace]
    span = max(starts, default=0.0) - min(starts, default=0.0)
    if len(starts) < 2 or span <= 0:
        raise ValueError("the trace's arrivals span no time: its rate is undefined (use --trace-speed)")
    return (len(starts) - 1) / span


@dataclass(frozen=True)
class TracePoint:
    """One replay of a sweep: ``rate`` requests/s, which is ``speed``× the trace's own."""

    rate: float
    speed: float


def trace_points(trace: list[Session], speeds: list[float] | None = None,
                 rates: list[float] | None = None) -> list[TracePoint]:
    """The sweep's points from ``--trace-speed`` or ``--rates`` (neither: the trace's own pace;
    a trace whose requests all arrive at once has rate 0 and only that point)."""
    if speeds and rates:
        raise ValueError("give --trace-speed or --rates for a trace, not both")
    for x in speeds or rates or []:
        if x <= 0:
            raise ValueError(f"trace speeds and rates must be > 0, got {x}")
    if rates:
        own = own_rate(trace)
        return [TracePoint(r, r / own) for r in rates]
    try:
        own = own_rate(trace)
    except ValueError:
        if speeds and speeds != [1.0]:
            raise
        return [TracePoint(0.0, 1.0)]   # all at once: only its own pace makes sense
    return [TracePoint(float(f"{own * k:.6g}"), k) for k in speeds or [1.0]]


def rescale(trace: list[Session], speed: float, duration_s: float | None = None) -> tuple[list[Session], int]:
    """The trace at ``speed``× its rate, the first arrival at 0 (new sessions; the turns are
    shared), and how many were left out by the ``duration_s`` cap."""
    t0 = min((s.start for s in trace), default=0.0)
    out = [Session(s.sid, s.turns, s.prefix, (s.start - t0) / speed, s.tenant, s.priority) for s in trace]
    kept = out if duration_s is None else [s for s in out if s.start < duration_s]
    return kept, len(out) - len(kept)


def replay(trace: list[Session], point: TracePoint, duration_s: float | None,
           say: Callable[[str], object] = lambda m: print(m, file=sys.stderr)) -> tuple[list[Session], dict]:
    """The sessions of one point and its ``runs[rate]`` fields (``trace_speed``,
    ``trace_requests`` sent, ``trace_left_out`` by the cap); ``say``s when the cap truncates."""
    sessions, dropped = rescale(trace, point.speed, duration_s)
    if dropped:
        say(f"trace at {point.speed:g}x ({point.rate:.4g} req/s): --duration {duration_s:g} s keeps "
            f"{len(sessions)} of {len(trace)} requests")
    return sessions, {"trace_speed": point.speed, "trace_requests": len(sessions), "trace_left_out": dropped}


def sweep_fields(trace: list[Session], runs: dict[float, dict], best: float | None) -> dict:
    """A trace sweep's summary fields: its own rate and the highest sustained speed."""
    try:
        own = own_rate(trace)
    except ValueError:
        own = None
    return {"trace_requests": len(trace), "trace_own_rps": own,
            "max_trace_speed_meeting_slo": None if best is None else runs[best]["trace_speed"]}


def parse_floats(spec: str | None, flag: str) -> list[float] | None:
    """``"0.5,1,2"`` → ``[0.5, 1.0, 2.0]`` (None for no spec)."""
    if not spec:
        return None
    try:
        return [float(x) for x in spec.split(",")]
    except ValueError as e:
        raise ValueError(f"{flag}: expected comma-separated numbers, got {spec!r}") from e

"""One record per request (``requests.jsonl``), the same for ``warmpath bench`` and the
simulator (pure, no torch).

Each line: the rate point, session and turn, class, success, TTFT / TPOT / E2E, tokens
(prompt, cached, output), client wait, whether it attained the target, and the path it took
where known — ``tier`` (``cold`` / ``warm`` / ``local`` / ``replica`` / ``pd``), the
``prefill`` and ``decode`` workers, ``ppd`` (``local`` / ``remote`` / ``None``), the prompt
tokens cached by tier (``L1`` / ``L2`` / ``L3``, as measured by the stage that computed the
prompt), the router's predicted TTFT, the stages' ``Server-Timing`` (seconds), and — where the
``goodput`` policy chose — its ``path`` (``local`` / ``warm`` / ``cold``) and predicted TPOT. A real
warmpath router reports the path in ``X-Warmpath-Route`` / ``-Worker`` / ``-Decode`` / ``-Path``,
its predictions in ``X-Warmpath-Predicted-TTFT-S`` / ``-TPOT-S``, the
stage times in ``Server-Timing`` and the loads in ``usage["warmpath"]``; another server
reports none of it (``None``). The simulator knows all of it; of ``Server-Timing`` only the
``route`` stage (the router's admission wait).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

ROUTE_KEYS = ("path", "prefill", "decode", "ppd", "cached_by_tier", "predicted_ttft_s", "server_timing",
              "predicted_tpot_s", "ppd_reason")


def server_timing(value: str | None) -> dict[str, float] | None:
    """``"route;dur=1.5, prefill;dur=20.0"`` → ``{"route": 0.0015, "prefill": 0.02}`` (seconds)."""
    if not value:
        return None
    out = {}
    for part in value.split(","):
        name, *params = (p.strip() for p in part.split(";"))
        for p in params:
            k, _, v = p.partition("=")
            if k == "dur" and name:
                try:
                    out[name] = float(v) / 1000
                except ValueError:
                    pass
    return out or None


def cached_by_tier(usage: Mapping | None) -> dict[str, int] | None:
    """Prompt tokens by tier from ``usage["warmpath"]``: the prefill stage's report when the
    request was disaggregated, else the serving worker's own loads."""
    ext = (usage or {}).get("warmpath") or {}
    if "prefill" in ext:
        tiers = (ext["prefill"] or {}).get("cached_by_tier")
    elif "worker" in ext:
        tiers = (ext["worker"] or {}).get("loaded_tokens")
    else:
        return None
    return {k: int(v) for k, v in (tiers or {}).items()}


def route_from_http(headers: Mapping[str, str], usage: Mapping | None) -> dict:
    """The path a warmpath router reports (headers are case-insensitive in httpx; give a
    lower-cased dict otherwise); empty values where the server says nothing."""
    h = {k.lower(): v for k, v in headers.items()}
    path, decode, worker = h.get("x-warmpath-route"), h.get("x-warmpath-decode"), h.get("x-warmpath-worker")
    return {"path": path, "prefill": worker if worker and worker != decode else None, "decode": decode,
            "ppd": "local" if path == "local" else None, "cached_by_tier": cached_by_tier(usage),
            "predicted_ttft_s": _seconds(h.get("x-warmpath-predicted-ttft-s")),
            "server_timing": server_timing(h.get("server-timing")),
            "predicted_tpot_s": _seconds(h.get("x-warmpath-predicted-tpot-s")), "ppd_reason": h.get("x-warmpath-ppd")}


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def request_row(r, rate: float | None, attained: bool) -> dict:
    """One ``requests.jsonl`` line for ``r`` (a ``bench/metrics.Record``) at ``rate``."""
    return {"rate": rate, "sid": r.sid, "turn": r.turn, "class": r.cls, "ok": r.ok, "error": r.error,
            "ttft_s": r.ttft, "tpot_s": r.tpot, "e2e_s": r.e2e, "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens, "output_tokens": r.output_tokens, "client_wait_s": r.client_wait_s,
            "attained": attained, "tenant": r.tenant, "priority": r.priority, **{k: r.route.get(k) for k in ROUTE_KEYS}}


def write_requests(path: Path, rows: list[dict]) -> None:
    """``rows`` as JSON lines."""
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

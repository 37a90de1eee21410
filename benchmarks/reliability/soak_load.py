"""The soak's load: benchmarks/policies/real_policies.py's coding-agent workload as an open loop of sessions
through the router, every request counted as sent, completed, failed or lost.

*failed*: the server answered with an error (an HTTP error status, or an error event in the
stream); *lost*: no answer (the request timed out, or the connection broke). Prompts are token
ids; each answer joins its session's history re-tokenized (the tokenizer only, no torch).
"""

from __future__ import annotations

import argparse
from collections import Counter

import httpx

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.bench.metrics import summarize
from warmpath.bench.runner import Answer, BenchTarget, OpenAITarget, run
from warmpath.bench.workload import Session, coding_agent, repo_contexts
from warmpath.models.files import load_tokenizer

# benchmarks/policies/real_policies.py's AGENT and SEED (the workload its sustained rate was measured on),
# copied: importing real_policies.py would load torch in this client
AGENT = {"repos": 3, "context": 1536, "warm_ratio": 0.75, "doc_tokens": 2048, "turns": 3, "question": 64, "answer": 32}
REPO_SEED = 7
LOST_HINT = "no answer: timed out or the connection broke"


def sessions(rate: float, duration_s: float, seed: int) -> list[Session]:
    """Sessions with Poisson arrivals at ``rate`` over ``duration_s``; the repositories primed."""
    times = arrival_times(ArrivalConfig(rate, duration_s, seed=seed))
    out = coding_agent(len(times), seed, primed=True, repo_seed=REPO_SEED, **AGENT)
    for s, t in zip(out, times):
        s.start = t
    return out


def prime(base: str) -> None:
    """Each repository context once through the router, so that its KV is in the cluster."""
    for ctx in repo_contexts(REPO_SEED, AGENT["repos"], AGENT["context"]):
        r = httpx.post(base + "/v1/completions", json={"prompt": ctx + [1000, 1001], "max_tokens": 1}, timeout=300)
        r.raise_for_status()


def outcome(a: Answer) -> str:
    """``completed``, ``failed`` (an error answer) or ``lost`` (no answer)."""
    if a.ok:
        return "completed"
    err = a.error or ""
    return "failed" if err.startswith(("HTTP ", "stream error")) else "lost"


class CountingTarget(BenchTarget):
    """``inner`` with every request counted in ``counts`` (sent / completed / failed / lost)
    as it goes, and the distinct errors kept."""

    def __init__(self, inner: BenchTarget, counts: dict) -> None:
        self.inner, self.counts = inner, counts
        self.errors: Counter[str] = Counter()

    async def complete(self, prompt: list[int], max_tokens: int, session_id: str) -> Answer:
        self.counts["sent"] += 1
        a = await self.inner.complete(prompt, max_tokens, session_id)
        self.counts[outcome(a)] += 1
        if a.error:
            self.errors[a.error[:160]] += 1
        return a

    async def server_metrics(self) -> dict[str, float]:
        return await self.inner.server_metrics()

    async def close(self) -> None:
        await self.inner.close()


def _p(classes: dict, c: str) -> str:
    """TTFT ``p50 / p90`` of class ``c`` as text (seconds)."""
    x = classes[c]
    return " / ".join("-" if x[k] is None else f"{x[k]:.2f}" for k in ("ttft_p50_s", "ttft_p90_s"))


def encoder():
    """Text -> token ids as the workers tokenize (no special tokens added)."""
    tok = load_tokenizer()
    return lambda text: tok.encode(text, add_special=False)


async def run_load(base: str, a: argparse.Namespace, ss: list[Session], encode, counts: dict) -> dict:
    """Run every session to its end (the drain included); what the client saw."""
    target = CountingTarget(OpenAITarget(base, timeout_s=a.request_timeout_s), counts)
    try:
        records, wall = await run(target, ss, encode=encode, seed=a.seed)
    finally:
        await target.close()
    classes = summarize(records, wall, {})
    in_flight = counts["sent"] - counts["completed"] - counts["failed"] - counts["lost"]
    return {"requests": {**counts, "in_flight_at_end": in_flight}, "sessions": len(ss), "wall_s": round(wall, 1),
            "achieved_rps": classes["all"]["completed"] / wall if wall > 0 else 0.0,
            "latency": {c: _p(classes, c) for c in ("warm", "cold", "all")},
            "classes": {c: {k: classes[c][k] for k in ("completed", "failed", "ttft_p50_s", "ttft_p90_s", "tpot_s")}
                        for c in ("all", "warm", "cold")},
            "errors": dict(target.errors.most_common(10))}

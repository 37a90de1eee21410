"""The real-cluster benchmarks' coding-agent workload, worker flags and SLO: what
``benchmarks/policies/real_policies.py`` runs and what the simulator-accuracy and reliability
benchmarks replay (the same repository contexts, sessions and arrivals by seed)."""

from __future__ import annotations

import time

import httpx

from warmpath.slo import CLUSTER_TARGET
from warmpath.bench.workload import coding_agent, long_conversations, repo_contexts

WORKERS = ["--kv-cache-gib", "0.5", "--l2-gib", "0.5", "--heartbeat-s", "2", "--threads", "1"]
# Stated before measuring (slo.py): interactive (warm) requests must start within
# 2 s at p90, new documents within 20 s at p90, and 99% of requests must succeed.
TARGET = CLUSTER_TARGET
SLO = {c: TARGET.bounds(c).ttft_p90 for c in ("warm", "cold")}   # its TTFT p90 bound per class


AGENT = dict(repos=3, context=1536, warm_ratio=0.75, doc_tokens=2048, turns=3, question=64, answer=32)
SEED = 7


def agent(n: int, seed: int):
    return coding_agent(n, seed, primed=True, repo_seed=SEED, **AGENT)


def flood(n: int, seed: int):
    """Half of the sessions are new documents: more cold work than one worker can absorb."""
    return coding_agent(n, seed, primed=True, repo_seed=SEED, **{**AGENT, "warm_ratio": 0.5})


def prime(url: str, decode=None) -> None:
    """Send each repository context once so its KV is in the cluster (L3) before measuring
    (as text when ``decode`` is given: a peer router that takes no token ids)."""
    for ctx in repo_contexts(SEED, AGENT["repos"], AGENT["context"]):
        prompt = decode(ctx + [1000, 1001]) if decode else ctx + [1000, 1001]
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1},
                       timeout=300)
        r.raise_for_status()
    time.sleep(1.0)


def conversations(n: int, seed: int):
    return long_conversations(n, seed, turns=5, first=1024, follow=48, answer=32)


def meets(classes: dict) -> bool:
    """The run met ``TARGET`` (``Target.met``: success, attainment and TTFT p90 per class)."""
    return TARGET.met(classes)

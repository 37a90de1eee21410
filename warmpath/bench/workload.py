"""Benchmark workloads as sessions of turns over token ids (no torch, no tokenizer).

A *session* is a list of turns sent one after another (turn k+1 after turn k's answer,
whose text the runner appends to the history). Single-turn requests are sessions of one
turn. Prompts are token ids sent to ``/v1/completions``, so equal ids are equal blocks on
any server serving the same tokenizer.
"""

from __future__ import annotations

import csv
import json
import random
from array import array
from dataclasses import dataclass, field
from pathlib import Path

VOCAB_LO, VOCAB_HI = 1000, 40000   # ordinary tokens of the SmolLM2 vocabulary (no specials)


@dataclass
class Turn:
    """New user tokens of this turn, the answer length asked for, and its class label."""

    new_tokens: list[int]
    max_tokens: int
    cls: str = "cold"                # the workload's label; results are classed by measured reuse (reuse.py)


@dataclass
class Session:
    """Turns of one conversation; ``start`` is its arrival (seconds) once arrivals are set."""

    sid: str
    turns: list[Turn]
    prefix: list[int] = field(default_factory=list)   # shared context sent before turn 1
    start: float = 0.0
    tenant: str = "default"       # whom it is for (a trace's "tenant"; routing/tenants.py)
    priority: int = 0             # smaller is more urgent (a trace's "priority")


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


def fast_tokens(rng: random.Random, n: int) -> list[int]:
    """Like :func:`tokens` (other values), ~20x faster: for simulated 100K-token prompts."""
    span = VOCAB_HI - VOCAB_LO
    return [VOCAB_LO + x % span for x in array("H", rng.randbytes(2 * n))]


def block_tokens(block_id: int, size: int, salt: int = 0) -> list[int]:
    """Deterministic token block for a trace ``hash_id``: equal ids → equal blocks (another
    ``salt``: other blocks)."""
    return tokens(random.Random(f"block-{block_id}" if not salt else f"block-{salt}-{block_id}"), size)


def _lognormal(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    import math

    mu = math.log(mean) - sigma * sigma / 2
    return max(lo, min(hi, int(rng.lognormvariate(mu, sigma))))


def _s(x: float, scale: float) -> int:
    return max(1, int(x * scale))


def coding_agent(n: int, seed: int = 0, scale: float = 1.0, repos: int = 4, context: int = 2048,
                 warm_ratio: float = 0.7, doc_tokens: int = 2048, turns: int = 3, question: int = 64,
                 answer: int = 64, primed: bool = False, repo_seed: int | None = None,
                 gen=tokens) -> list[Session]:
    """Shared repository contexts with multi-turn sessions, plus a stream of cold documents.

    A fraction ``warm_ratio`` of sessions work on one of ``repos`` repositories (Zipf-like
    popularity): the first use of a repository is cold, later ones warm (all warm when
    ``primed``: the caller sent :func:`repo_contexts` beforehand; ``repo_seed`` picks the
    repositories, default ``seed``). The rest are new
    documents of ``doc_tokens`` tokens (always cold, one turn). ``scale`` shrinks all lengths;
    ``gen`` makes the token ids (:func:`fast_tokens` for very long simulated prompts).
    """
    context, doc_tokens = _s(context, scale), _s(doc_tokens, scale)
    question, answer = _s(question, scale), _s(answer, scale)
    rng = random.Random(seed)
    ctx = repo_contexts(seed if repo_seed is None else repo_seed, repos, context, gen)
    weights = [1 / (r + 1) for r in range(repos)]
    seen: set[int] = set(range(repos)) if primed else set()
    out = []
    for i in range(n):
        if rng.random() < warm_ratio:
            r = rng.choices(range(repos), weights)[0]
            cls = "warm" if r in seen else "cold"
            seen.add(r)
            ts = [Turn(gen(rng, question), answer, cls)]
            ts += [Turn(gen(rng, question), answer, "warm") for _ in range(rng.randint(0, turns - 1))]
            out.append(Session(f"agent-{i}", ts, prefix=ctx[r]))
        else:
            out.append(Session(f"doc-{i}", [Turn(gen(rng, doc_tokens), answer, "cold")]))
    return out


def repo_contexts(seed: int, repos: int, context: int, gen=tokens) -> list[list[int]]:
    """The shared repository contexts of :func:`coding_agent` (same seed, same tokens)."""
    return [gen(random.Random(f"repo-{seed}-{r}"), context) for r in range(repos)]


def multi_turn_chat(n: int, seed: int = 0, scale: float = 1.0, mean_turns: float = 3.0,
                    user_mean: int = 96, answer_mean: int = 192, max_len: int = 1024) -> list[Session]:
    """ShareGPT/WildChat-like: geometric turn counts, log-normal user and answer lengths
    (all lengths times ``scale``)."""
    user_mean, answer_mean, max_len = _s(user_mean, scale), _s(answer_mean, scale), _s(max_len, scale)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = 1
        while rng.random() > 1 / mean_turns and k < 8:
            k += 1
        out.append(Session(f"chat-{i}", [
            Turn(tokens(rng, _lognormal(rng, user_mean, 0.8, 1, max_len)),
                 _lognormal(rng, answer_mean, 0.8, 1, max_len), "cold" if t == 0 else "warm")
            for t in range(k)]))
    return out


def long_conversations(n: int, seed: int = 0, scale: float = 1.0, turns: int = 5, first: int = 1024,
                       follow: int = 48, answer: int = 32) -> list[Session]:
    """Agent-style conversations: a long first turn, then ``turns - 1`` short follow-ups
    (the PPD case: each follow-up's history is already on the decode worker)."""
    first, follow, answer = _s(first, scale), _s(follow, scale), _s(answer, scale)
    rng = random.Random(seed)
    return [Session(f"conv-{i}", [Turn(tokens(rng, first if t == 0 else follow), answer,
                                       "cold" if t == 0 else "warm") for t in range(turns)])
            for i in range(n)]


PPD_FIRST = [(512, 64), (1024, 64)]
PPD_FOLLOW = [(32, 512), (32, 128), (32, 32), (256, 512), (256, 128), (256, 32),
              (1024, 512), (1024, 128), (1024, 32)]


def ppd_grid(n: int, seed: int = 0, scale: float = 1.0) -> list[Session]:
    """The PPD paper's grid: 2 first-turn × 9 follow-up (n_in, n_out) settings, cycled.

    ``scale`` shrinks every length (e.g. 0.25 on a 2-core CPU).
    """
    rng = random.Random(seed)
    combos = [(f, g) for f in PPD_FIRST for g in PPD_FOLLOW]
    out = []
    for i in range(n):
        (i1, o1), (i2, o2) = combos[i % len(combos)]
        out.append(Session(f"ppd-{i}", [Turn(tokens(rng, _s(i1, scale)), _s(o1, scale), "cold"),
                                        Turn(tokens(rng, _s(i2, scale)), _s(o2, scale), "warm")]))
    return out


def mooncake_trace(path: Path, block_tokens_: int = 512, limit: int | None = None,
                   max_output: int | None = None, salt: int = 0) -> list[Session]:
    """Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``;
    optionally ``tenant`` and ``priority``, as the router reads them from a request).

    Each ``hash_id`` names a block of ``block_tokens_`` tokens (512 in the trace; smaller to
    scale a replay down); the prompt is those blocks, cut to the scaled input length.
    Arrivals keep the trace's timestamps (``replay.rescale`` changes the pace).
    """
    out = []
    scale = block_tokens_ / 512
    blocks: dict[int, list[int]] = {}   # a shared hash_id's block is drawn once (and shared)
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            row = json.loads(line)
            for h in row["hash_ids"]:
                if h not in blocks:
                    blocks[h] = block_tokens(h, block_tokens_, salt)
            ids = [t for h in row["hash_ids"] for t in blocks[h]]
            n_in = max(1, min(len(ids), int(row["input_length"] * scale)))
            n_out = max(1, int(row["output_length"] * scale))
            if max_output:
                n_out = min(n_out, max_output)
            prio = row.get("priority", 0)
            if not isinstance(prio, int) or isinstance(prio, bool) or not -(2 ** 15) <= prio < 2 ** 15:
                raise ValueError(f"{path}: line {i + 1}: priority must be an integer in [-32768, 32767], got {prio!r}")
            s = Session(f"trace-{i}", [Turn(ids[:n_in], n_out, "cold")], tenant=str(row.get("tenant", "default")),
                        priority=prio)
            s.start = row["timestamp"] / 1000
            out.append(s)
    return out


def csv_trace(path: Path, seed: int = 0, token_scale: float = 1.0, limit: int | None = None) -> list[Session]:
    """CSV of (arrival s, prompt tokens, output tokens), e.g. the Azure traces; unique prompts."""
    rng = random.Random(seed)
    out = []
    with open(path) as f:
        for i, row in enumerate(csv.reader(f)):
            if i == 0 and not row[0].replace(".", "").isdigit():
                continue
            if limit is not None and len(out) >= limit:
                break
            t, n_in, n_out = float(row[0]), int(row[1]), int(row[2])
            s = Session(f"csv-{i}", [Turn(tokens(rng, max(1, int(n_in * token_scale))),
                                          max(1, int(n_out * token_scale)), "cold")])
            s.start = t
            out.append(s)
    return out


WORKLOADS = {"coding-agent": coding_agent, "multi-turn-chat": multi_turn_chat, "ppd-grid": ppd_grid,
             "long-conversations": long_conversations}

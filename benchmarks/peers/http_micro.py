"""Micro measurements of one OpenAI-compatible server through HTTP, the same for any server.

Every request is a streamed ``/v1/completions`` with a token-id prompt, ``temperature: 0``
and ``ignore_eos`` (the bench library's :class:`OpenAITarget`), so the servers compared get
the same token ids and generate the same number of tokens:

* decode batch 1: one request at a time (32-token prompt, ``decode_tokens`` out);
  TPOT = (E2E − TTFT) / (tokens − 1), the median over repeats.
* decode with ``streams`` concurrent requests (a server needs that many slots): output
  tokens / wall time of the whole wave, and the median TPOT of its streams.
* prefill: TTFT of a cold ``prefill_tokens``-token prompt with ``max_tokens: 1``. Every
  repeat is a new random prompt, so no prefix cache (warmpath's blocks, llama-server's slot
  or RAM prompt cache) can serve any of it; ``cached_tokens`` is reported to show that.
  The table adds prefill tok/s = ``prefill_tokens`` / that TTFT (:func:`micro_rows`).

All prompts come from fixed seeds: each server gets the same ones. One warm-up of each
kind runs first and is not counted.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from warmpath.bench.runner import Answer, OpenAITarget
from warmpath.bench.workload import tokens


def prompt(kind: str, i: int, n: int) -> list[int]:
    """A random prompt of ``n`` token ids, one per (kind, i): prompts share no prefix."""
    return tokens(random.Random(f"http-micro-{kind}-{i}"), n)


def _checked(a: Answer, what: str) -> Answer:
    if not a.ok:
        raise RuntimeError(f"{what}: request failed: {a.error}")
    return a


def _tpot(a: Answer) -> float | None:
    return (a.e2e - a.ttft) / (a.output_tokens - 1) if a.output_tokens > 1 else None


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


async def decode_batch1(t: OpenAITarget, repeats: int, decode_tokens: int) -> dict:
    """Median TPOT of single requests sent one after another."""
    answers = [_checked(await t.complete(prompt("decode1", i, 32), decode_tokens, f"d1-{i}"), "decode b1")
               for i in range(repeats)]
    return {"tpot_s": _median([_tpot(a) for a in answers]), "tpots_s": [_tpot(a) for a in answers],
            "output_tokens": [a.output_tokens for a in answers]}


async def decode_concurrent(t: OpenAITarget, repeats: int, streams: int, decode_tokens: int) -> dict:
    """``streams`` requests at once, ``repeats`` waves: output tok/s of a wave, TPOT."""
    waves = []
    for w in range(repeats):
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(t.complete(prompt(f"decode{streams}-{w}", i, 32), decode_tokens,
                                                    f"dn-{w}-{i}") for i in range(streams)))
        wall = time.perf_counter() - t0
        answers = [_checked(a, f"decode x{streams}") for a in answers]
        out = sum(a.output_tokens for a in answers)
        waves.append({"wall_s": wall, "output_tokens": out, "tok_s": out / wall,
                      "tpot_s": _median([_tpot(a) for a in answers]),
                      "ttft_max_s": max(a.ttft for a in answers)})
    return {"streams": streams, "tok_s": _median([w["tok_s"] for w in waves]),
            "tpot_s": _median([w["tpot_s"] for w in waves]), "waves": waves}


async def prefill(t: OpenAITarget, repeats: int, prefill_tokens: int) -> dict:
    """Median TTFT of cold ``prefill_tokens``-token prompts, one new prompt per repeat."""
    answers = [_checked(await t.complete(prompt(f"prefill{prefill_tokens}", i, prefill_tokens), 1, f"p-{i}"),
                        "prefill") for i in range(repeats)]
    return {"prompt_tokens": prefill_tokens, "ttft_s": _median([a.ttft for a in answers]),
            "ttfts_s": [a.ttft for a in answers], "cached_tokens": [a.cached_tokens for a in answers],
            "reported_prompt_tokens": [a.prompt_tokens for a in answers]}


async def run_micro(url: str, repeats: int = 5, streams: int = 16, decode_tokens: int = 128,
                    prefill_tokens: int = 2048, timeout_s: float = 300.0, api_key: str | None = None) -> dict:
    """All three measurements against ``url`` (after one uncounted warm-up of each); ``api_key``:
    sent as a bearer token (a warmpath worker behind a router asks for the cluster token)."""
    t = OpenAITarget(url, timeout_s=timeout_s, api_key=api_key)
    try:
        for a in await asyncio.gather(t.complete(prompt("warm", 0, 32), 8, "warm-0"),
                                      *(t.complete(prompt("warm", i, 32), 8, f"warm-{i}")
                                        for i in range(1, streams))):
            _checked(a, "warm-up")
        _checked(await t.complete(prompt("warm-prefill", 0, prefill_tokens), 1, "warm-p"), "warm-up prefill")
        return {"decode_batch1": await decode_batch1(t, repeats, decode_tokens),
                f"decode_x{streams}": await decode_concurrent(t, max(1, repeats // 2), streams, decode_tokens),
                "prefill": await prefill(t, repeats, prefill_tokens),
                "settings": {"repeats": repeats, "streams": streams, "decode_tokens": decode_tokens,
                             "prefill_tokens": prefill_tokens, "temperature": 0, "ignore_eos": True}}
    finally:
        await t.close()


def micro_rows(results: dict[str, dict], streams: int,
               prefill_tokens: int) -> list[tuple[str, dict[str, float | None], bool]]:
    """(label, value per server, lower is better) for the table."""
    def get(path: tuple[str, str], scale: float = 1.0) -> dict[str, float | None]:
        out = {}
        for server, r in results.items():
            v = r.get(path[0], {}).get(path[1])
            out[server] = None if v is None else v * scale
        return out
    ttft = get(("prefill", "ttft_s"))
    return [("decode batch-1 TPOT ms", get(("decode_batch1", "tpot_s"), 1e3), True),
            (f"decode x{streams} output tok/s", get((f"decode_x{streams}", "tok_s")), False),
            (f"decode x{streams} TPOT ms", get((f"decode_x{streams}", "tpot_s"), 1e3), True),
            (f"prefill TTFT s (cold {prefill_tokens}-token prompt, max_tokens 1)", ttft, True),
            (f"prefill tok/s (the {prefill_tokens} tokens / that TTFT)",
             {s: prefill_tokens / v if v else None for s, v in ttft.items()}, False)]

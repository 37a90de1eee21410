"""Token sampling: repetition penalty, then greedy, or temperature → top-k → top-p → min-p
with per-request seeded generators."""

from __future__ import annotations

import os
from typing import Sequence as Seq

import torch

from warmpath.engine.sequence import SamplingParams


def penalize_(logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
              penalty: float | torch.Tensor) -> torch.Tensor:
    """In place, returns ``logits`` [N, V]: each ``logits[rows[k], cols[k]]`` (pairs given
    once: a token counts once however often it occurred) is divided by ``penalty`` (a float
    or [K]) if positive, multiplied if negative (HF ``RepetitionPenaltyLogitsProcessor``,
    vLLM). Only the K entries are touched (no copy of the [N, V] logits)."""
    vals = logits[rows, cols]
    return logits.index_put_((rows, cols), torch.where(vals > 0, vals / penalty, vals * penalty))


def distribution(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits [V] (penalized already) → the probabilities [V] a non-greedy request samples from.

    The logits are divided by the temperature; then top-k keeps the ``top_k`` likeliest
    tokens, top-p the smallest set of the likeliest of those whose mass reaches ``top_p``,
    and min-p the tokens at least ``min_p`` × as likely as the likeliest (HF's order).
    """
    row = row / p.temperature
    if p.top_k and p.top_k < row.shape[-1]:
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, idx = torch.sort(row, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop tokens whose preceding cumulative mass already reaches top_p.
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        drop[0] = False   # NOTE: the likeliest token stays even when top_p rounds to 0 in float32 (1e-300)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        row = torch.full_like(row, float("-inf")).scatter(0, idx, sorted_logits)
    probs = row.softmax(-1)
    if p.min_p > 0:
        # NOTE: the filters above keep the likeliest token and rescale the rest alike, so
        # this ratio to the maximum is the one of the unfiltered distribution.
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    return probs


class Sampler:
    """Samples one token per row of logits.

    Each request gets its own ``torch.Generator`` (seeded from ``params.seed`` or
    randomly), so a seeded request's output does not depend on its batch mates.

    A row whose sampling raises fails that request alone: :meth:`sample` reports it in its
    error map (the row's greedy token stands in; the engine then fails the request).
    ``fail_seeds``: fault injection for tests — sampling a request with one of these seeds
    raises, as a request-specific bug inside a step would.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._gens: dict[str, torch.Generator] = {}
        # request id → (tokens of its history counted, their distinct ids as a set and as a
        # [K] tensor on the device), grown step by step
        self._seen: dict[str, tuple[int, set[int], torch.Tensor]] = {}
        self.fail_seeds: set[int] = set()

    def release(self, request_id: str) -> None:
        """Forget a finished request's generator and seen tokens."""
        self._gens.pop(request_id, None)
        self._seen.pop(request_id, None)

    def seen(self, request_id: str, history: tuple[Seq[int], Seq[int]]) -> torch.Tensor:
        """[K] long: the distinct tokens of ``history`` (prompt, output), which only grows;
        each call adds the tokens new since the last (NOTE: not O(context) per step)."""
        prompt, output = history
        total = len(prompt) + len(output)
        n, known, ids = self._seen.get(request_id, (0, set(), None))
        if ids is None or n > total:
            n, known, ids = 0, set(), torch.empty(0, dtype=torch.long, device=self.device)
        if n < total:
            new = [t for t in dict.fromkeys([*prompt[n:], *output[max(0, n - len(prompt)):]]) if t not in known]
            if new:
                known.update(new)
                ids = torch.cat([ids, torch.tensor(new, dtype=torch.long, device=self.device)])
        self._seen[request_id] = (total, known, ids)
        return ids

    def _gen(self, request_id: str, seed: int | None) -> torch.Generator:
        g = self._gens.get(request_id)
        if g is None:
            g = torch.Generator(device=self.device)
            g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
            self._gens[request_id] = g
        return g

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams],
               history: list[tuple[Seq[int], Seq[int]] | None] | None = None) -> tuple[list[int], dict[str, str]]:
        """logits [N, V] float32 → (N token ids, {request id: error} for rows that failed).

        ``history[i]``: row i's (prompt, output) token lists, needed where
        ``params[i].penalizes``; those rows of ``logits`` are penalized in place (the step's
        own tensor). Greedy rows take the argmax (of the penalized logits)."""
        errors: dict[str, str] = {}
        logits = self._penalized(logits, request_ids, params, history, errors)
        out = logits.argmax(dim=-1).tolist()
        for i, p in enumerate(params):
            if p.greedy or request_ids[i] in errors:
                continue
            try:
                out[i] = self._sample_row(logits[i], request_ids[i], p)
            except Exception as e:  # noqa: BLE001 - one request's fault must not stop the batch
                errors[request_ids[i]] = f"sampling failed: {type(e).__name__}: {e}"
        return out, errors

    def _penalized(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams],
                   history: list | None, errors: dict[str, str]) -> torch.Tensor:
        """logits [N, V] with the rows that penalize repetition penalized in place (one batched
        op over their seen tokens; a row whose history fails fails alone)."""
        rows, ids, pens = [], [], []
        for i, p in enumerate(params):
            if p.penalizes:
                try:
                    ids.append(self.seen(request_ids[i], history[i]))
                    rows.append(i)
                    pens.append(p.repetition_penalty)
                except Exception as e:  # noqa: BLE001 - one request's fault must not stop the batch
                    errors[request_ids[i]] = f"sampling failed: {type(e).__name__}: {e}"
        if not rows:
            return logits
        counts = torch.tensor([len(x) for x in ids], device=logits.device)
        row_of = torch.tensor(rows, device=logits.device).repeat_interleave(counts)
        pen_of = torch.tensor(pens, dtype=logits.dtype, device=logits.device).repeat_interleave(counts)
        return penalize_(logits, row_of, torch.cat(ids), pen_of)

    def _sample_row(self, row: torch.Tensor, request_id: str, p: SamplingParams) -> int:
        if p.seed is not None and p.seed in self.fail_seeds:
            raise RuntimeError(f"injected sampler fault (seed {p.seed})")
        return int(torch.multinomial(distribution(row, p), 1, generator=self._gen(request_id, p.seed)))

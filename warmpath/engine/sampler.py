"""Token sampling: greedy, temperature, top-k, top-p, per-request seeded generators."""

from __future__ import annotations

import os

import torch

from warmpath.engine.sequence import SamplingParams


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
        self.fail_seeds: set[int] = set()

    def release(self, request_id: str) -> None:
        """Forget a finished request's generator."""
        self._gens.pop(request_id, None)

    def _gen(self, request_id: str, seed: int | None) -> torch.Generator:
        g = self._gens.get(request_id)
        if g is None:
            g = torch.Generator(device=self.device)
            g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
            self._gens[request_id] = g
        return g

    def sample(self, logits: torch.Tensor, request_ids: list[str],
               params: list[SamplingParams]) -> tuple[list[int], dict[str, str]]:
        """logits [N, V] float32 → (N token ids, {request id: error} for rows that failed)."""
        out = logits.argmax(dim=-1).tolist()
        errors: dict[str, str] = {}
        for i, p in enumerate(params):
            if p.greedy:
                continue
            try:
                out[i] = self._sample_row(logits[i], request_ids[i], p)
            except Exception as e:  # noqa: BLE001 - one request's fault must not stop the batch
                errors[request_ids[i]] = f"sampling failed: {type(e).__name__}: {e}"
        return out, errors

    def _sample_row(self, logits: torch.Tensor, request_id: str, p: SamplingParams) -> int:
        if p.seed is not None and p.seed in self.fail_seeds:
            raise RuntimeError(f"injected sampler fault (seed {p.seed})")
        row = logits / p.temperature
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
        return int(torch.multinomial(probs, 1, generator=self._gen(request_id, p.seed)))

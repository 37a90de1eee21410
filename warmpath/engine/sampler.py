"""Token sampling: greedy, temperature, top-k, top-p, per-request seeded generators."""

from __future__ import annotations

import os

import torch

from warmpath.engine.sequence import SamplingParams


class Sampler:
    """Samples one token per row of logits.

    Each request gets its own ``torch.Generator`` (seeded from ``params.seed`` or
    randomly), so a seeded request's output does not depend on its batch mates.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._gens: dict[str, torch.Generator] = {}

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
               params: list[SamplingParams]) -> list[int]:
        """logits [N, V] float32 → N token ids."""
        out = logits.argmax(dim=-1).tolist()
        for i, p in enumerate(params):
            if p.greedy:
                continue
            row = logits[i] / p.temperature
            if p.top_k and p.top_k < row.shape[-1]:
                kth = torch.topk(row, p.top_k).values[-1]
                row = row.masked_fill(row < kth, float("-inf"))
            if p.top_p < 1.0:
                sorted_logits, idx = torch.sort(row, descending=True)
                probs = sorted_logits.softmax(-1)
                # Drop tokens whose preceding cumulative mass already reaches top_p.
                drop = (probs.cumsum(-1) - probs) >= p.top_p
                sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
                row = torch.full_like(row, float("-inf")).scatter(0, idx, sorted_logits)
            probs = row.softmax(-1)
            out[i] = int(torch.multinomial(probs, 1, generator=self._gen(request_ids[i], p.seed)))
        return out

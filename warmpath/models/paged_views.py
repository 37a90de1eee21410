"""Attention that reads paged K/V where it lies (eager; CPU and CUDA).

A sequence's block table is cut into *runs* of consecutive block ids; a run of the cache
``[num_blocks, bs, KVH, D]`` is a view ``[run_len * bs, KVH, D]`` — nothing is copied.
Attention over each run returns its output and log-sum-exp, and the runs are merged
exactly (split-K with a log-sum-exp merge)::

    lse = logsumexp_r lse_r,    o = Σ_r exp(lse_r − lse) · o_r

Queries are grouped by KV head (``[1, KVH, G·q, D]``, G = H / KVH) so GQA reads each K/V
row once and never repeats it. A table cut into more than ``MAX_RUNS`` runs is gathered
(copied): past that, one small attention call per run costs more than the copy (measured
on the 2-core CPU: ~50 µs a call vs ~0.2 ms to gather a 256-token sequence); such decodes
are gathered together into one padded batch (``gather_decode``, the former path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_RUNS = 4

Run = tuple[int, int, int]   # (first block, last block + 1, tokens used in the run)


def block_runs(table: list[int], n_tokens: int, block_size: int) -> list[Run]:
    """The runs of consecutive block ids covering the first ``n_tokens`` tokens of ``table``.

    >>> block_runs([7, 8, 9, 3, 4], 70, 16)
    [(7, 10, 48), (3, 5, 22)]
    """
    nb = -(-n_tokens // block_size)
    if n_tokens <= 0:
        return []
    if nb > len(table):
        raise ValueError(f"block table of {len(table)} blocks cannot hold {n_tokens} tokens")
    runs: list[Run] = []
    a = 0
    for i in range(1, nb + 1):
        if i == nb or table[i] != table[i - 1] + 1:
            used = min((i - a) * block_size, n_tokens - a * block_size)
            runs.append((table[a], table[i - 1] + 1, used))
            a = i
    return runs


def attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with its log-sum-exp: q [1, h, M, D], k/v [1, h, L, D] (any strides)
    → (o [1, h, M, D], lse [1, h, M] float32)."""
    if q.device.type == "cpu":
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale)
        return o, lse
    # NOTE: the math formulation on other devices (no fused kernel returns the LSE there
    # through a stable API); not run by the tests, which have no GPU.
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:
        m, n = s.shape[-2], s.shape[-1]
        keep = torch.ones(m, n, dtype=torch.bool, device=s.device).tril(n - m)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.matmul((s - lse.unsqueeze(-1)).exp(), v.float())
    return o.to(q.dtype), lse


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention outputs over disjoint key sets: [(o [.., M, D], lse [.., M])] → (o, lse)."""
    if len(parts) == 1:
        return parts[0]
    lses = torch.stack([lse for _, lse in parts])
    tot = torch.logsumexp(lses, 0)
    w = (lses - tot).exp().unsqueeze(-1)
    o = (torch.stack([o.float() for o, _ in parts]) * w).sum(0)
    return o.to(parts[0][0].dtype), tot


def _run_kv(cache: torch.Tensor, run: Run) -> torch.Tensor:
    """A run of the cache [NB, bs, KVH, D] as a view [1, KVH, tokens, D] (one ``as_strided``
    on a contiguous cache: each view op costs a dispatch, and decode makes two per sequence)."""
    a, _, used = run
    if not cache.is_contiguous():
        return cache[a:].flatten(0, 1)[:used].transpose(0, 1).unsqueeze(0)
    kvh, d = cache.shape[2], cache.shape[3]
    return cache.as_strided((1, kvh, used, d), (0, d, kvh * d, 1),
                            cache.storage_offset() + a * cache.stride(0))


def attend_context(qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   table: list[int], runs: list[Run], scale: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped queries qg [1, KVH, M, D] over a sequence's cached tokens (all visible)."""
    if len(runs) > MAX_RUNS:        # fragmented: one copy of this sequence's blocks
        used = sum(r[2] for r in runs)
        idx = torch.tensor(table[:-(-used // k_cache.shape[1])], device=k_cache.device)
        kk = k_cache[idx].flatten(0, 1)[:used].transpose(0, 1).unsqueeze(0).to(qg.dtype)
        vv = v_cache[idx].flatten(0, 1)[:used].transpose(0, 1).unsqueeze(0).to(qg.dtype)
        return attend_lse(qg, kk, vv, scale)
    # A cache of another dtype than the queries' (--kv-dtype float16): each run converted (copied).
    return merge([attend_lse(qg, _run_kv(k_cache, r).to(qg.dtype), _run_kv(v_cache, r).to(qg.dtype),
                             scale) for r in runs])


def padded_tables(tables: list[list[int]], ctx: list[int], block_size: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables padded with block 0 [n, W] and the key mask [n, 1, 1, W * bs] of ``ctx``."""
    width = max(len(t) for t in tables)
    tab = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)
    pos = torch.arange(width * block_size, device=device)
    c = torch.tensor(ctx, dtype=torch.long, device=device)
    return tab, (pos[None, :] < c[:, None])[:, None, None, :]


def gather_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  tables: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """The copying path: each sequence's blocks gathered into a padded batch. q [n, H, D] → [n, H, D]."""
    kk = k_cache[tables].flatten(1, 2).transpose(1, 2).to(q.dtype)      # [n, KVH, W*bs, D]
    vv = v_cache[tables].flatten(1, 2).transpose(1, 2).to(q.dtype)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), kk, vv, attn_mask=mask, scale=scale,
                                       enable_gqa=True)
    return o.squeeze(2)


def decode_inplace(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   tables: list[list[int]], ctx: list[int], runs: list[list[Run]], scale: float,
                   out: torch.Tensor) -> None:
    """One query token per sequence: q [n, H, D] → ``out[:n]`` [n, H, D], sequence by sequence
    (sequences whose tables have more than ``MAX_RUNS`` runs: gathered, as one batch)."""
    n, h, d = q.shape
    kvh = k_cache.shape[2]
    qg = q.view(n, 1, kvh, h // kvh, d)
    frag = [i for i in range(n) if len(runs[i]) > MAX_RUNS]
    inplace = [i for i in range(n) if len(runs[i]) <= MAX_RUNS]
    outs = [attend_context(qg[i], k_cache, v_cache, tables[i], runs[i], scale)[0] for i in inplace]
    if len(inplace) == n:
        out[:n] = torch.cat(outs).view(n, h, d)
    elif inplace:
        out[torch.tensor(inplace, device=q.device)] = torch.cat(outs).view(len(inplace), h, d)
    if frag:
        tab, mask = padded_tables([tables[i] for i in frag], [ctx[i] for i in frag],
                                  k_cache.shape[1], q.device)
        rows = torch.tensor(frag, device=q.device)
        out[rows] = gather_decode(q[rows], k_cache, v_cache, tab, mask, scale)


def prefill_inplace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, table: list[int], prefix_runs: list[Run],
                    scale: float) -> torch.Tensor:
    """A prefill chunk q/k/v [q, H|KVH, D] continuing a cached prefix (the runs):
    prefix keys are all visible, the chunk's own keys causally → [q, H, D]."""
    t, h, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    # The chunk's own keys: causal, heads expanded (a copy of the chunk's K/V, not the cache's).
    own = attend_lse(q.transpose(0, 1).unsqueeze(0),
                     k.repeat_interleave(g, dim=1).transpose(0, 1).unsqueeze(0),
                     v.repeat_interleave(g, dim=1).transpose(0, 1).unsqueeze(0), scale, causal=True)
    if not prefix_runs:
        return own[0][0].transpose(0, 1)
    qg = q.view(t, kvh, g, d).permute(1, 0, 2, 3).reshape(1, kvh, t * g, d)
    po, plse = attend_context(qg, k_cache, v_cache, table, prefix_runs, scale)
    # [1, KVH, t*G, ...] -> [1, H, t, ...] (head = kv_head * G + g)
    po = po.view(1, kvh, t, g, d).transpose(2, 3).reshape(1, h, t, d)
    plse = plse.view(1, kvh, t, g).transpose(2, 3).reshape(1, h, t)
    o, _ = merge([own, (po, plse)])
    return o[0].transpose(0, 1)

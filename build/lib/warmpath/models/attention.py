"""Attention over a paged KV cache.

One step's tokens are laid out flat: ``[decode tokens | prefill chunk 1 | prefill chunk 2 ...]``.
Decodes (one query token each) are attended as one padded batch; each prefill
chunk is attended on its own (it may continue a cached or chunked prefix).

KV cache of one layer: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``.
A token's *slot* is ``block_id * block_size + offset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """One sequence's prefill chunk: tokens ``[start, start+q_len)`` of the step.

    ``ctx_len`` counts every token attended to (cached prefix + this chunk);
    ``block_table`` ([num_blocks] long) covers ``ctx_len`` tokens.
    """

    start: int
    q_len: int
    ctx_len: int
    block_table: torch.Tensor
    mask: torch.Tensor | None = None  # [q_len, ctx_len] bool, None when ctx_len == q_len


@dataclass
class DecodeBatch:
    """Decode tokens ``[0, n)`` of the step."""

    n: int
    block_tables: torch.Tensor  # [n, max_blocks] long, padded with 0
    mask: torch.Tensor          # [n, 1, 1, max_blocks*block_size] bool


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step (built once, used by every layer)."""

    slot_mapping: torch.Tensor  # [T] long
    decode: DecodeBatch | None = None
    prefills: list[PrefillSpan] = field(default_factory=list)

    @classmethod
    def build(cls, block_size: int, decode_tables: list[list[int]], decode_ctx: list[int],
              prefill: list[tuple[int, int, list[int]]], slot_mapping: list[int],
              device: torch.device) -> "AttentionMetadata":
        """Make tensors from plain lists.

        Args:
            decode_tables / decode_ctx: block table and context length per decode.
            prefill: ``(q_len, ctx_len, block_table)`` per prefill chunk, in step order.
            slot_mapping: slot of every token of the step.
        """
        meta = cls(torch.tensor(slot_mapping, dtype=torch.long, device=device))
        if decode_tables:
            width = max(len(t) for t in decode_tables)
            tables = torch.tensor([t + [0] * (width - len(t)) for t in decode_tables],
                                  dtype=torch.long, device=device)
            ctx = torch.tensor(decode_ctx, dtype=torch.long, device=device)
            pos = torch.arange(width * block_size, device=device)
            mask = (pos[None, :] < ctx[:, None])[:, None, None, :]
            meta.decode = DecodeBatch(len(decode_tables), tables, mask)
        start = len(decode_tables)
        for q_len, ctx_len, table in prefill:
            mask = None
            if ctx_len != q_len:
                qpos = torch.arange(ctx_len - q_len, ctx_len, device=device)
                mask = torch.arange(ctx_len, device=device)[None, :] <= qpos[:, None]
            meta.prefills.append(PrefillSpan(
                start, q_len, ctx_len, torch.tensor(table, dtype=torch.long, device=device), mask))
            start += q_len
        return meta


def _gather(cache: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    # cache [num_blocks, bs, kvh, d], table [..., nb] -> [..., nb*bs, kvh, d]
    g = cache[table]
    return g.flatten(-4, -3)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Write this step's K/V into the cache and attend.

    Args:
        q: [T, H, D]; k, v: [T, KVH, D]; kv_cache: [2, num_blocks, bs, KVH, D].
    Returns:
        [T, H, D]
    """
    kvh, d = k.shape[1], k.shape[2]
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    k_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    if meta.decode is not None:
        dec = meta.decode
        kk = _gather(k_cache, dec.block_tables).transpose(1, 2)  # [n, KVH, L, D]
        vv = _gather(v_cache, dec.block_tables).transpose(1, 2)
        qq = q[:dec.n].unsqueeze(2)                              # [n, H, 1, D]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=dec.mask, scale=scale,
                                           enable_gqa=True)
        out[:dec.n] = o.squeeze(2)
    for sp in meta.prefills:
        qq = q[sp.start:sp.start + sp.q_len].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        if sp.mask is None:
            kk = k[sp.start:sp.start + sp.q_len].transpose(0, 1).unsqueeze(0)
            vv = v[sp.start:sp.start + sp.q_len].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale,
                                               enable_gqa=True)
        else:
            kk = _gather(k_cache, sp.block_table)[:sp.ctx_len].transpose(0, 1).unsqueeze(0)
            vv = _gather(v_cache, sp.block_table)[:sp.ctx_len].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=sp.mask, scale=scale,
                                               enable_gqa=True)
        out[sp.start:sp.start + sp.q_len] = o[0].transpose(0, 1)
    return out

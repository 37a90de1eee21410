"""Attention over a paged KV cache.

One step's tokens are laid out flat: ``[decode tokens | prefill chunk 1 | prefill chunk 2 ...]``.
Each prefill chunk is attended on its own (it may continue a cached or chunked prefix).

Two implementations (``AttentionMetadata.impl``):

* ``paged`` (default): K/V blocks are read where they lie. Decodes: on CPU float32 one call
  per layer of the C kernel (``paged_decode_op.py``: writes the decode rows' K/V and attends
  through the block tables), else sequence by sequence over views of runs of consecutive
  blocks merged by log-sum-exp (``paged_views.py``), as prefill chunks over a cached prefix.
* ``gather``: the former path, kept for debugging: every layer copies each sequence's
  blocks into a padded tensor (``cache[table]``) and decodes attend as one padded batch.

KV cache of one layer: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``.
A token's *slot* is ``block_id * block_size + offset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from warmpath.models import paged_decode_op, paged_views
from warmpath.models.paged_views import Run

ATTENTION_IMPLS = ("paged", "gather")


@dataclass
class PrefillSpan:
    """One sequence's prefill chunk: tokens ``[start, start+q_len)`` of the step.

    ``ctx_len`` counts every token attended to (cached prefix + this chunk);
    ``block_table`` ([num_blocks] long) covers ``ctx_len`` tokens.
    """

    start: int
    q_len: int
    ctx_len: int
    block_table: torch.Tensor | None  # ``gather`` only
    mask: torch.Tensor | None = None  # [q_len, ctx_len] bool, None when ctx_len == q_len (gather)
    table: list[int] = field(default_factory=list)
    prefix_runs: list[Run] = field(default_factory=list)   # the cached prefix (paged)


@dataclass
class DecodeBatch:
    """Decode tokens ``[0, n)`` of the step."""

    n: int
    tables: list[list[int]]
    ctx: list[int]              # tokens attended per sequence (this step's included)
    block_size: int = 0
    block_tables: torch.Tensor | None = None  # gather: [n, max_blocks] long, padded with 0
    mask: torch.Tensor | None = None          # gather: [n, 1, 1, max_blocks*block_size] bool
    table_tensor: torch.Tensor | None = None  # paged: [n, max_blocks] int32, padded with 0
    ctx_tensor: torch.Tensor | None = None    # paged: [n] long
    _runs: list[list[Run]] | None = field(default=None, repr=False)

    @property
    def runs(self) -> list[list[Run]]:
        """Each table's runs of consecutive blocks (``paged`` without the C kernel; made once)."""
        if self._runs is None:
            self._runs = [paged_views.block_runs(t, c, self.block_size)
                          for t, c in zip(self.tables, self.ctx)]
        return self._runs


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step (built once, used by every layer)."""

    slot_mapping: torch.Tensor  # [T] long
    decode: DecodeBatch | None = None
    prefills: list[PrefillSpan] = field(default_factory=list)
    impl: str = "paged"

    @classmethod
    def build(cls, block_size: int, decode_tables: list[list[int]], decode_ctx: list[int],
              prefill: list[tuple[int, int, list[int]]], slot_mapping: list[int],
              device: torch.device, impl: str = "paged") -> AttentionMetadata:
        """Make tensors from plain lists.

        Args:
            decode_tables / decode_ctx: block table and context length per decode.
            prefill: ``(q_len, ctx_len, block_table)`` per prefill chunk, in step order.
            slot_mapping: slot of every token of the step.
            impl: ``paged`` or ``gather`` (see the module docstring).
        """
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
        meta = cls(torch.tensor(slot_mapping, dtype=torch.long, device=device), impl=impl)
        if decode_tables and impl == "paged":
            width = max(len(t) for t in decode_tables)
            meta.decode = DecodeBatch(
                len(decode_tables), decode_tables, decode_ctx, block_size,
                table_tensor=torch.tensor([t + [0] * (width - len(t)) for t in decode_tables],
                                          dtype=torch.int32, device=device),
                ctx_tensor=torch.tensor(decode_ctx, dtype=torch.long, device=device))
        elif decode_tables:
            tables, mask = paged_views.padded_tables(decode_tables, decode_ctx, block_size, device)
            meta.decode = DecodeBatch(len(decode_tables), decode_tables, decode_ctx, block_size,
                                      block_tables=tables, mask=mask)
        start = len(decode_tables)
        for q_len, ctx_len, table in prefill:
            if impl == "paged":
                meta.prefills.append(PrefillSpan(start, q_len, ctx_len, None, None, table,
                                                 paged_views.block_runs(table, ctx_len - q_len, block_size)))
                start += q_len
                continue
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
    dec = meta.decode
    native = meta.impl == "paged" and dec is not None and paged_decode_op.native_for(q, k_cache)
    if k_cache.dtype != k.dtype and not (native and dec.n == q.shape[0]):
        # A narrower cache (--kv-dtype float16): every token attends over K/V as the cache holds
        # them, its own chunk's included, so output never depends on chunking or prefix hits.
        # (Decode-only native steps need nothing: the kernel reads its rows from the cache.)
        k, v = k.to(k_cache.dtype).to(k.dtype), v.to(v_cache.dtype).to(v.dtype)
    if native:
        return _native_step(q, k, v, k_cache, v_cache, meta, scale)
    k_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
    out = torch.empty_like(q)
    if meta.impl == "paged":
        _attend_paged(q, k, v, k_cache, v_cache, meta, scale, out)
        return out
    if meta.decode is not None:
        dec = meta.decode
        out[:dec.n] = paged_views.gather_decode(q[:dec.n], k_cache, v_cache, dec.block_tables,
                                                dec.mask, scale)
    for sp in meta.prefills:
        qq = q[sp.start:sp.start + sp.q_len].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        if sp.mask is None:
            kk = k[sp.start:sp.start + sp.q_len].transpose(0, 1).unsqueeze(0)
            vv = v[sp.start:sp.start + sp.q_len].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=scale,
                                               enable_gqa=True)
        else:
            kk = _gather(k_cache, sp.block_table)[:sp.ctx_len].transpose(0, 1).unsqueeze(0).to(q.dtype)
            vv = _gather(v_cache, sp.block_table)[:sp.ctx_len].transpose(0, 1).unsqueeze(0).to(q.dtype)
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=sp.mask, scale=scale,
                                               enable_gqa=True)
        out[sp.start:sp.start + sp.q_len] = o[0].transpose(0, 1)
    return out


def _native_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """The op (C kernel) writes the decode rows' K/V and attends them; prefill rows as before.
    Called through the dispatcher (~5 µs) so that profiles count it as attention."""
    dec, t = meta.decode, q.shape[0]
    n = dec.n
    if t == n:      # decodes only: one call, its output is the step's
        return paged_decode_op.paged_decode(q, k, v, k_cache, v_cache, meta.slot_mapping,
                                            dec.table_tensor, dec.ctx_tensor, scale)
    kvh, d = k.shape[1], k.shape[2]
    k_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping[n:], k[n:].to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping[n:], v[n:].to(v_cache.dtype))
    out = torch.empty_like(q)
    out[:n] = paged_decode_op.paged_decode(q[:n], k[:n], v[:n], k_cache, v_cache,
                                           meta.slot_mapping[:n], dec.table_tensor,
                                           dec.ctx_tensor, scale)
    _attend_paged(q, k, v, k_cache, v_cache, meta, scale, out, decodes=False)
    return out


def _attend_paged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                  out: torch.Tensor, decodes: bool = True) -> None:
    if decodes and meta.decode is not None:
        dec = meta.decode
        paged_views.decode_inplace(q[:dec.n], k_cache, v_cache, dec.tables, dec.ctx, dec.runs,
                                   scale, out)
    for sp in meta.prefills:
        sl = slice(sp.start, sp.start + sp.q_len)
        if sp.ctx_len == sp.q_len:   # nothing cached before the chunk: plain causal attention
            o = F.scaled_dot_product_attention(
                q[sl].transpose(0, 1).unsqueeze(0), k[sl].transpose(0, 1).unsqueeze(0),
                v[sl].transpose(0, 1).unsqueeze(0), is_causal=True, scale=scale, enable_gqa=True)
            out[sl] = o[0].transpose(0, 1)
        else:
            out[sl] = paged_views.prefill_inplace(q[sl], k[sl], v[sl], k_cache, v_cache, sp.table,
                                                  sp.prefix_runs, scale)

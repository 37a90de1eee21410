"""Decode attention over the paged KV cache as one torch op: ``torch.ops.warmpath.paged_decode``.

For one layer and B decode tokens it writes this step's K/V rows into the caches at their
slots, then attends each sequence's query over its first ``ctx[b]`` tokens (this token
included), read in place through its block table::

    out = paged_decode(q, k, v, k_cache, v_cache, slots, tables, ctx, scale)
    # q [B, H, D]; k, v [B, KVH, D]; caches [NB, bs, KVH, D] (contiguous, written at slots);
    # slots [B] (block * bs + offset, -1: row not written); tables [B, W] int32/int64 padded;
    # ctx [B] (≥ 1) → out [B, H, D]

A padded batch (a compiled step's bucket) gives its padding rows slot -1 (nothing written),
ctx 1 and any valid block (their output is garbage to drop).

On CPU with float32 q/k/v and float32 or float16 caches (``--kv-dtype``) it runs the C kernel (``native/paged_decode.c``, ``warmpath.models._paged``,
built by setup.py): one pass with an online softmax per (sequence, KV head), GQA heads
together, on ``torch.get_num_threads()`` threads of its own small pool when the work is
large enough; a sequence's output does not depend on the batch (bit for bit); float16 rows
are written rounded to nearest even (as ``Tensor.half()``) and read exactly. Anything else
(CUDA, other dtypes, the extension not built) runs ``torch_decode``: ``index_copy_`` and
block-table index arithmetic (which inductor fuses; eager it materialises the lookups).

The op (the caches mutated in its schema, a fake for shapes) is one opaque node for
``torch.compile(fullgraph=True)``, dynamic batch included; ``decode`` is its body.
"""

from __future__ import annotations

import torch

try:
    from warmpath.models import _paged
except ImportError:         # no C compiler at install: the torch formulation runs
    _paged = None

_F32, _F16, _I64 = torch.float32, torch.float16, torch.int64
_CACHE = (_F32, _F16)
_INDEX = (torch.int32, torch.int64)


def available() -> bool:
    """Whether the C kernel was built (CPU float32 calls use it)."""
    return _paged is not None


def native_for(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether a call with these tensors runs the C kernel."""
    return (_paged is not None and q.is_cpu and q.dtype == _F32
            and k_cache.dtype in _CACHE)


def indexed_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      tables: torch.Tensor, ctx: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per row, K/V looked up through the block table by index arithmetic:
    q [B, H, D]; caches [NB, bs, KVH, D]; tables [B, W]; ctx [B] (≥ 1) → [B, H, D]
    (computed in float32 at least)."""
    b, h, d = q.shape
    bs, kvh = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(tables.shape[1] * bs, device=q.device)
    blk, off = tables.long()[:, pos // bs], (pos % bs)[None, :]           # [B, L], [1, L]
    kk = k_cache[blk, off].permute(0, 2, 1, 3)                            # [B, KVH, L, D]
    vv = v_cache[blk, off].permute(0, 2, 1, 3)
    acc = torch.promote_types(q.dtype, torch.float32)          # float32, or float64 for float64
    qq = q.view(b, kvh, 1, h // kvh, d).to(acc)
    s = (qq * kk[:, :, :, None, :].to(acc)).sum(-1) * scale               # [B, KVH, L, G]
    s = s.masked_fill((pos[None, :] >= ctx[:, None])[:, None, :, None], float("-inf"))
    p = s.softmax(2)
    o = (p[..., None] * vv[:, :, :, None, :].to(acc)).sum(2)              # [B, KVH, G, D]
    return o.reshape(b, h, d).to(q.dtype)


def torch_decode(q, k, v, k_cache, v_cache, slots, tables, ctx, scale: float) -> torch.Tensor:
    """The same op in torch (any device and dtype): writes K/V at ``slots`` (not at -1), then
    ``indexed_attention``. NOTE: the -1 rows are dropped by a boolean mask (a host sync on CUDA)."""
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    keep = slots >= 0
    slots, k, v = slots[keep].long(), k[keep], v[keep]
    k_cache.view(-1, kvh, d).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, slots, v.to(v_cache.dtype))
    return indexed_attention(q, k_cache, v_cache, tables, ctx.long(), scale)


def _rows(t: torch.Tensor, name: str, heads: int, d: int) -> tuple[torch.Tensor, int]:
    """``t`` [B, heads, D] float32 with each row contiguous (copied if not), row stride in bytes."""
    shape, st = t.shape, t.stride()
    if len(shape) != 3 or shape[1] != heads or shape[2] != d or t.dtype != _F32:
        raise ValueError(f"{name} must be float32 [B, {heads}, {d}], got {list(shape)} {t.dtype}")
    if (heads > 1 and st[1] != d) or (d > 1 and st[2] != 1):
        t = t.contiguous()
        st = t.stride()
    return t, st[0] * 4


def _index(t: torch.Tensor) -> torch.Tensor:
    """``t`` as contiguous int64 (no copy when it is)."""
    return t if t.dtype == _I64 and t.stride() == (1,) else t.to(_I64).contiguous()


def _native(q, k, v, k_cache, v_cache, slots, tables, ctx, scale, out) -> int:
    """Fills ``out`` with the C kernel; returns the threads it used. (Every check here costs
    ~0.2 µs, and the op runs once per layer: they are kept few.)"""
    shape = k_cache.shape
    if len(shape) != 4 or v_cache.shape != shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"caches must both be [NB, bs, KVH, D] of one dtype, got {list(shape)}"
                         f" {k_cache.dtype} and {list(v_cache.shape)} {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("caches must be contiguous [NB, bs, KVH, D] (they are written in place)")
    nb, bs, kvh, d = shape
    qshape = q.shape
    if len(qshape) != 3 or qshape[2] != d or qshape[1] % kvh:
        raise ValueError(f"q must be [B, H, {d}] with H a multiple of {kvh}, got {list(qshape)}")
    b, h = qshape[0], qshape[1]
    q, qs = _rows(q, "q", h, d)
    k, ks = _rows(k, "k", kvh, d)
    v, vs = _rows(v, "v", kvh, d)
    tshape = tables.shape
    if len(tshape) != 2 or tables.dtype not in _INDEX or tshape[1] < 1:
        raise ValueError(f"tables must be [B, W] int32 or int64, got {list(tshape)} {tables.dtype}")
    if tables.stride()[1] != 1:
        tables = tables.contiguous()
    slots, ctx = _index(slots), _index(ctx)
    if not (k.shape[0] == v.shape[0] == slots.shape[0] == tshape[0] == ctx.shape[0] == b):
        raise ValueError(f"q, k, v, slots, tables and ctx must have the same batch {b}: "
                         f"{k.shape[0]}, {v.shape[0]}, {slots.shape[0]}, {tshape[0]}, {ctx.shape[0]}")
    if out.shape != qshape or out.dtype != _F32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 [{b}, {h}, {d}] tensor")
    return _paged.decode(q.data_ptr(), qs, k.data_ptr(), ks, v.data_ptr(), vs, k_cache.data_ptr(),
                         v_cache.data_ptr(), out.data_ptr(), slots.data_ptr(), tables.data_ptr(),
                         tables.dtype == _I64, tables.stride()[0], ctx.data_ptr(), b, h, kvh, d,
                         bs, nb, tshape[1], float(scale), torch.get_num_threads(),
                         k_cache.dtype == _F16)


def decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
           v_cache: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor, ctx: torch.Tensor,
           scale: float) -> torch.Tensor:
    """The op's body (callable without the dispatcher). Bad shapes, dtypes or indices (a slot,
    block or ctx outside the cache or table) raise ``ValueError`` before anything is written
    (C kernel)."""
    if not native_for(q, k_cache):
        return torch_decode(q, k, v, k_cache, v_cache, slots, tables, ctx, scale)
    out = q.new_empty(q.shape)
    _native(q, k, v, k_cache, v_cache, slots, tables, ctx, scale, out)
    return out


# NOTE: registered with the low-level ``torch.library.Library`` rather than
# ``torch.library.custom_op``: the same schema (the caches mutated, ``Tensor(a!)``), the same
# fake, the same graphs (reinplaced, no cache copy), but ~25 µs less per call (measured:
# custom_op's Python wrapper around the kernel), which at 30 layers is ~1 ms per step.
_LIB = torch.library.Library("warmpath", "FRAGMENT")
_LIB.define("paged_decode(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
            "Tensor slots, Tensor tables, Tensor ctx, float scale) -> Tensor")
_LIB.impl("paged_decode", decode, "CompositeExplicitAutograd")


@torch.library.register_fake("warmpath::paged_decode")
def _(q, k, v, k_cache, v_cache, slots, tables, ctx, scale):
    return q.new_empty(q.shape)


paged_decode = torch.ops.warmpath.paged_decode
"""The op, ``torch.ops.warmpath.paged_decode`` (see the module docstring)."""

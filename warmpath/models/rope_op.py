"""Rotary embedding of a step's queries and keys in one C call (``native/rope.c``): the same
products, sums and differences as ``RotaryEmbedding.apply`` each rounded to float32, so the
result is bit for bit torch's; ~16 small operators a layer become one call (decode steps are
short enough that each operator's few microseconds of dispatch count)."""

from __future__ import annotations

import torch

try:
    from warmpath.models import _rope
except ImportError:         # no C compiler at install: torch computes it
    _rope = None


def available() -> bool:
    """Whether the C code was built."""
    return _rope is not None


def rope_qk(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, h: int, kvh: int, dh: int
            ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``qkv`` [T, ≥ (h + kvh)·dh] (queries, then keys, in each row), ``cos``/``sin`` [T, 1, dh/2]
    → (q [T, h, dh], k [T, kvh, dh]) rotated; None where the C path does not apply (not CPU
    float32, rows not unit-stride, no extension, inside a ``torch.compile`` trace): the caller
    then runs ``RotaryEmbedding.apply``."""
    if (_rope is None or qkv.dtype != torch.float32 or not qkv.is_cpu or qkv.dim() != 2
            or qkv.stride(1) != 1 or cos.dtype != torch.float32 or not cos.is_contiguous()
            or not sin.is_contiguous() or torch.compiler.is_compiling()):
        return None
    t = qkv.shape[0]
    if cos.numel() != t * (dh // 2) or sin.numel() != cos.numel():
        raise ValueError(f"cos and sin must hold [{t}, {dh // 2}] values, got {list(cos.shape)}, {list(sin.shape)}")
    q = torch.empty(t, h, dh)
    k = torch.empty(t, kvh, dh)
    _rope.rope_qk(qkv.data_ptr(), qkv.stride(0), t, h, kvh, dh, cos.data_ptr(), sin.data_ptr(),
                  q.data_ptr(), k.data_ptr())
    return q, k

"""A decoder layer's elementwise work in one C call each (``native/fused.c``), for the
int8-activation modes (``--quantization int8a8 | int4a8``): the residual add with the next
RMSNorm, and SiLU(gate) × up. A batch-1 decode step of SmolLM2 runs ~25 small operators a
layer; their dispatch, not their arithmetic, is what a step spends outside the linears.

The C norm sums squares in 8 lanes folded in a fixed order and SiLU uses a polynomial e^x:
not torch's last bits (these modes follow llama.cpp's arithmetic, not torch's), but the same
bits for a row alone or batched, on any thread and every CPU variant. Elsewhere (no extension,
not CPU float32, inside a ``torch.compile`` trace) the torch formulation runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    from warmpath.models import _fused
except ImportError:         # no C compiler at install: torch computes it
    _fused = None


def available() -> bool:
    """Whether the C code was built."""
    return _fused is not None


def variant() -> str:
    """avx512 | avx2 | baseline (``WARMPATH_QLINEAR_VARIANT`` forces one, as for the linears),
    or ``torch``."""
    return _fused.variant() if _fused is not None else "torch"


def _native(t: torch.Tensor) -> bool:
    return (_fused is not None and t.dtype == torch.float32 and t.is_cpu and t.dim() == 2
            and t.stride(1) == 1 and not torch.compiler.is_compiling())


def add_rmsnorm(x: torch.Tensor, h: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x += h`` in place (``h`` None: no add), then ``weight * x / sqrt(mean(x²) + eps)`` per
    row, returned as a new tensor. ``x``, ``h``: [T, D].

    Raises:
        ValueError: when the shapes disagree.
    """
    if h is not None and h.shape != x.shape:
        raise ValueError(f"residual {list(h.shape)} does not match {list(x.shape)}")
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"norm weight {list(weight.shape)} does not match rows of {x.shape[-1]}")
    if not (_native(x) and (h is None or _native(h)) and weight.is_contiguous()
            and weight.dtype == torch.float32):
        if h is not None:
            x.add_(h)
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    t, d = x.shape
    out = torch.empty(t, d)
    _fused.add_rmsnorm(x.data_ptr(), x.stride(0), 0 if h is None else h.data_ptr(),
                       0 if h is None else h.stride(0), weight.data_ptr(), out.data_ptr(), d, t, d,
                       eps, torch.get_num_threads())
    return out


def silu_mul(gu: torch.Tensor, inter: int) -> torch.Tensor:
    """Rows ``[gate | up]`` of the fused projection ([T, 2·inter]) → ``silu(gate) · up`` [T, inter].

    Raises:
        ValueError: when a row is not 2·inter wide.
    """
    if gu.shape[-1] != 2 * inter:
        raise ValueError(f"gate|up rows have {gu.shape[-1]} values, expected 2 x {inter}")
    if not _native(gu):
        gate, up = gu.split(inter, dim=-1)
        return F.silu(gate) * up
    t = gu.shape[0]
    out = torch.empty(t, inter)
    _fused.silu_mul(gu.data_ptr(), gu.stride(0), out.data_ptr(), inter, t, inter, torch.get_num_threads())
    return out

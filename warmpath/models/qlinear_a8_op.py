"""Grouped int8 / int4 weights times int8 activations (``--quantization int8a8 | int4a8``):
llama.cpp's arithmetic (Q8_0 / Q4_1 weights × Q8_1 activations) in warmpath's C kernel
(``native/qlinear_a8.c``, ``warmpath.models._qlinear_a8``).

The weights are ``qlinear_op``'s groups (the same ``quantize``: a Q4_1 / Q8_0 GGUF's weights
bit for bit); each step's activations are quantized per row in groups of 32 to int8 with one
float scale (``s = max|x| / 127``), so no scale spans the batch and a row's output is the same
bits alone or batched. Dot products are exact integer sums (AVX-512 VNNI ``vpdpbusd``); only
the activations' rounding (≤ s / 2 per element) separates the result from ``int4w``'s.
"""

from __future__ import annotations

import torch
from torch import nn

from warmpath.models.qlinear_op import GROUP, PANEL, dequantize, quantize, run_kernel

try:
    from warmpath.models import _qlinear_a8
except ImportError:         # no C compiler at install: the torch formulation runs
    _qlinear_a8 = None


def available() -> bool:
    """Whether the C kernel was built."""
    return _qlinear_a8 is not None


def variant() -> str:
    """avx512vnni | avx2 | baseline (``WARMPATH_QLINEAR_VARIANT=avx2|baseline`` forces one), or ``torch``."""
    return _qlinear_a8.variant() if _qlinear_a8 is not None else "torch"


def to_panels(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``quantize``'s output → native/qlinear_a8.c's layout: unsigned weights (8 bits: q + 128;
    4 bits: q) in 64-byte blocks of 16 columns × 4 consecutive k, [NP, NG, 8, 2, 64] (8 bits) or
    nibbles [NP, NG, 4, 2, 64] (k-quads j and j + 4 in one byte); scales and offsets
    [NP, NG, 32] float16. Padding columns and the last group's padding k are zero weights."""
    n, k = q.shape
    npan, ng = -(-n // PANEL), -(-k // GROUP)
    u = q.to(torch.int16) + (128 if m is None else 0)
    full = torch.full((npan * PANEL, ng * GROUP), 128 if m is None else 0, dtype=torch.int16)
    full[:n, :k] = u
    # [NP, half, col, NG, quad, r] → [NP, NG, quad, half, col, r]
    blocks = full.view(npan, 2, 16, ng, 8, 4).permute(0, 3, 4, 1, 2, 5).to(torch.uint8)
    if m is not None:
        blocks = blocks[:, :, :4] | (blocks[:, :, 4:] << 4)
    cols = lambda t: torch.cat([t, t.new_zeros(npan * PANEL - n, t.shape[1])]).view(  # noqa: E731
        npan, PANEL, ng).transpose(1, 2).contiguous()
    return blocks.reshape(npan, ng, -1).contiguous(), cols(d), None if m is None else cols(m)


def from_panels(wp: torch.Tensor, dp: torch.Tensor, mp: torch.Tensor | None, n: int, k: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``to_panels``' inverse: (q [n, k], d [n, NG], m [n, NG] or None)."""
    npan, ng = wp.shape[:2]
    b = wp.view(npan, ng, -1, 2, 16, 4)
    if mp is not None:
        b = torch.cat([b & 15, b >> 4], dim=2)
    u = b.permute(0, 3, 4, 1, 2, 5).reshape(npan * PANEL, ng * GROUP)[:n, :k].to(torch.int16)
    q = (u - 128).to(torch.int8) if mp is None else u.to(torch.uint8)
    rows = lambda t: t.transpose(1, 2).reshape(-1, ng)[:n]  # noqa: E731
    return q, rows(dp), None if mp is None else rows(mp)


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """[M, K] float32 → the values the kernel computes with: per row and group of 32,
    ``round(x · 127 / max|x|) · max|x| / 127`` (round half to even; 0 for an all-zero group)."""
    m, k = x.shape
    ng = -(-k // GROUP)
    g = torch.cat([x.float(), x.new_zeros(m, ng * GROUP - k)], dim=1).view(m, ng, GROUP)
    amax = g.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax.clamp(min=1e-30), torch.zeros_like(amax))
    q = torch.round(g * inv).clamp_(-127, 127)
    return (q * (amax / 127.0)).view(m, -1)[:, :k]


def torch_linear(x: torch.Tensor, wp: torch.Tensor, dp: torch.Tensor, mp: torch.Tensor | None,
                 bias: torch.Tensor | None, n: int, k: int) -> torch.Tensor:
    """The same linear in torch (any device; sums in another order): quantized activations
    times the dequantized weights."""
    w = dequantize(*from_panels(wp.cpu(), dp.cpu(), None if mp is None else mp.cpu(), n, k)).to(x.device)
    shape = x.shape
    y = quantize_activations(x.reshape(-1, k)) @ w.t()
    y = y if bias is None else y + bias
    return y.view(*shape[:-1], n).to(x.dtype)


def linear(x: torch.Tensor, wp: torch.Tensor, dp: torch.Tensor, mp: torch.Tensor | None,
           bias: torch.Tensor | None, n: int, k: int) -> torch.Tensor:
    """``x [..., k]`` float32 → ``[..., n]``: the C kernel on CPU float32, else ``torch_linear``.

    Raises:
        ValueError: when x's last dimension is not k.
    """
    y = run_kernel(None if _qlinear_a8 is None else _qlinear_a8.matmul, x, k, n, wp, dp, mp, bias)
    return torch_linear(x, wp, dp, mp, bias, n, k) if y is None else y


_LIB = torch.library.Library("warmpath", "FRAGMENT")
_LIB.define("linear_qa8(Tensor x, Tensor wp, Tensor dp, Tensor? mp, Tensor? bias, int n, int k) -> Tensor")
_LIB.impl("linear_qa8", linear, "CPU")
_LIB.impl("linear_qa8", torch_linear, "CUDA")
_LIB.impl("linear_qa8", lambda x, wp, dp, mp, bias, n, k: x.new_empty(*x.shape[:-1], n), "Meta")


class QA8Linear(nn.Module):
    """A ``Linear`` with ``bits``-bit grouped weights (8 or 4) and int8 activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int) -> None:
        super().__init__()
        wp, dp, mp = to_panels(*quantize(weight, bits))
        self.register_buffer("wp", wp, persistent=False)
        self.register_buffer("dp", dp, persistent=False)
        self.register_buffer("mp", mp, persistent=False)
        b = None if bias is None else bias.detach().float().contiguous()
        self.register_buffer("bias", b, persistent=False)
        self.out_features, self.in_features, self.bits = weight.shape[0], weight.shape[1], bits

    def dequantized(self) -> torch.Tensor:
        """The float32 [out, in] weight (the activations are rounded on top of it)."""
        return dequantize(*from_panels(self.wp, self.dp, self.mp, self.out_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the op inside graphs and under torch.profiler (``warmpath::linear_qa8``), else direct
        if torch._C._autograd._profiler_enabled() or torch.compiler.is_compiling():
            return torch.ops.warmpath.linear_qa8(x, self.wp, self.dp, self.mp, self.bias,
                                                 self.out_features, self.in_features)
        return linear(x, self.wp, self.dp, self.mp, self.bias, self.out_features, self.in_features)

"""Weight-only grouped linears (``--quantization int8w | int4w``): ``y = x · Wᵀ + b`` with W
held in groups of 32 weights along K, one IEEE-half scale (and for 4 bits one offset) per group
and output column; activations stay float32 and are never quantized.

* 8 bits: ``w = q · d``, q in [-127, 127], ``d = max|w| / 127`` — GGML's Q8_0 format.
* 4 bits: ``w = q · d + m``, q in [0, 15], ``m = min w``, ``d = (max w − m) / 15`` — Q4_1.

Both are what ``gguf``'s quantizers make, and ``q · d`` is exact in float32, so the weights of a
model converted from such a GGUF file (the default SmolLM2 is Q4_1 with a Q8_0 embedding) come
back bit for bit: ``int4w`` computes with the reference weights at a sixth of their bytes.

The C kernel (``native/qlinear.c``, ``warmpath.models._qlinear``) computes each output the same
way whatever the batch and wherever a row sits in it (no activation scale spans a step, unlike
fbgemm's dynamic ``int8``). ``torch.ops.warmpath.linear_q`` is the same computation as one opaque
op, so a ``torch.compile`` graph holds it whole. Off CPU, or without the extension,
``torch_linear`` computes it in torch (same weights; sums in another order).
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from warmpath.models import _qlinear
except ImportError:         # no C compiler at install: the torch formulation runs
    _qlinear = None

PANEL = 32      # output columns per panel (native/qlinear.c's P)
GROUP = 32      # weights per group along K (GS)


def available() -> bool:
    """Whether the C kernel was built."""
    return _qlinear is not None


def variant() -> str:
    """The kernel's instruction set (avx512 | avx2 | baseline), or ``torch`` without it."""
    return _qlinear.variant() if _qlinear is not None else "torch"


def _groups(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] → float32 [N, ceil(K/32), 32], the last group padded with zeros."""
    w = weight.detach().float()
    n, k = w.shape
    ng = -(-k // GROUP)
    if ng * GROUP != k:
        w = torch.cat([w, w.new_zeros(n, ng * GROUP - k)], dim=1)
    return w.view(n, ng, GROUP)


def quantize(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """[N, K] float → (q [N, K] int8 (8 bits) or uint8 in [0, 15] (4 bits), d [N, NG] float16,
    m [N, NG] float16 or None), with ``w ≈ q · d (+ m)`` group by group.

    Raises:
        ValueError: for bits other than 8 or 4.
    """
    g = _groups(weight)
    k = weight.shape[1]
    if bits == 8:
        d = (g.abs().amax(dim=2) / 127.0).half()
        df = d.float().unsqueeze(2)
        q = torch.where(df > 0, torch.round(g / df.clamp(min=1e-30)), torch.zeros_like(g))
        return q.clamp_(-127, 127).to(torch.int8).flatten(1)[:, :k].contiguous(), d, None
    if bits == 4:
        lo, hi = g.amin(dim=2), g.amax(dim=2)
        m, d = lo.half(), ((hi - lo) / 15.0).half()
        df, mf = d.float().unsqueeze(2), m.float().unsqueeze(2)
        q = torch.where(df > 0, torch.round((g - mf) / df.clamp(min=1e-30)), torch.zeros_like(g))
        return q.clamp_(0, 15).to(torch.uint8).flatten(1)[:, :k].contiguous(), d, m
    raise ValueError(f"bits must be 8 or 4, got {bits}")


def dequantize(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """``quantize``'s inverse: float32 [N, K] (q · d in float32, exact, then + m)."""
    n, k = q.shape
    rep = lambda t: t.float().repeat_interleave(GROUP, dim=1)[:, :k]  # noqa: E731
    w = q.float() * rep(d)
    return w if m is None else w + rep(m)


def to_panels(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``quantize``'s output → the kernel's layout: weights [NP, K, 32] int8 (8 bits) or
    [NP, K, 16] uint8 (4 bits: byte j = column j | column j + 16 << 4), scales and offsets
    [NP, NG, 32] float16; column n at panel n // 32, lane n % 32; padding columns 0."""
    n, k = q.shape
    npan = -(-n // PANEL)
    pad = lambda t: torch.cat([t, t.new_zeros(npan * PANEL - n, *t.shape[1:])]) if npan * PANEL > n else t  # noqa: E731
    cols = lambda t: pad(t).view(npan, PANEL, t.shape[1]).transpose(1, 2).contiguous()  # noqa: E731
    qp = cols(q)                                               # [NP, K, 32]
    if m is not None:
        qp = (qp[..., :PANEL // 2] | (qp[..., PANEL // 2:] << 4)).contiguous()
    return qp, cols(d), None if m is None else cols(m)


def from_panels(qp: torch.Tensor, dp: torch.Tensor, mp: torch.Tensor | None, n: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``to_panels``' inverse: (q [n, K], d [n, NG], m [n, NG] or None)."""
    if mp is not None:
        qp = torch.cat([qp & 15, qp >> 4], dim=2)
    rows = lambda t: t.transpose(1, 2).reshape(-1, t.shape[1])[:n]  # noqa: E731
    return rows(qp), rows(dp), None if mp is None else rows(mp)


def torch_linear(x: torch.Tensor, qp: torch.Tensor, dp: torch.Tensor, mp: torch.Tensor | None,
                 bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """The same linear in torch (any device): ``x @ dequantize(...)ᵀ + bias``."""
    w = dequantize(*from_panels(qp, dp, mp, n)).to(x.device)
    y = x.float() @ w.t()
    return (y if bias is None else y + bias).to(x.dtype)


def run_kernel(matmul, x: torch.Tensor, k: int, n: int, wp: torch.Tensor, dp: torch.Tensor,
               mp: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x [..., k]`` → ``[..., n]`` by a grouped kernel's ``matmul`` (native/qlinear.c and
    native/qlinear_a8.c take the same arguments); None where it does not apply (no extension,
    not CPU float32): the caller computes in torch.

    Raises:
        ValueError: when x's last dimension is not k.
    """
    if x.shape[-1] != k:
        raise ValueError(f"input has {x.shape[-1]} features, the weight takes {k}")
    if matmul is None or x.dtype != torch.float32 or not x.is_cpu:
        return None
    x2 = x
    if x.dim() != 2 or not x.is_contiguous():      # else the decode step's case: no reshape (µs a call)
        x2 = x.reshape(-1, k)
        if x2.stride(-1) != 1 or x2.stride(0) < k:
            x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], n)
    matmul(8 if mp is None else 4, x2.data_ptr(), x2.stride(0), wp.data_ptr(), dp.data_ptr(),
           0 if mp is None else mp.data_ptr(), 0 if bias is None else bias.data_ptr(),
           y.data_ptr(), n, x2.shape[0], k, n, torch.get_num_threads())
    return y if x2 is x else y.view(*x.shape[:-1], n)


def linear(x: torch.Tensor, qp: torch.Tensor, dp: torch.Tensor, mp: torch.Tensor | None,
           bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """``x [..., K]`` float32 → ``[..., n]`` over ``to_panels``' layout: the C kernel on CPU
    float32, else ``torch_linear``.

    Raises:
        ValueError: when x's last dimension is not the weight's K.
    """
    y = run_kernel(None if _qlinear is None else _qlinear.matmul, x, qp.shape[1], n, qp, dp, mp, bias)
    return torch_linear(x, qp, dp, mp, bias, n) if y is None else y


_LIB = torch.library.Library("warmpath", "FRAGMENT")
_LIB.define("linear_q(Tensor x, Tensor qp, Tensor dp, Tensor? mp, Tensor? bias, int n) -> Tensor")
_LIB.impl("linear_q", linear, "CPU")
_LIB.impl("linear_q", torch_linear, "CUDA")
_LIB.impl("linear_q", lambda x, qp, dp, mp, bias, n: x.new_empty(*x.shape[:-1], n), "Meta")


class QLinear(nn.Module):
    """A ``Linear`` whose [out, in] weight is held in groups of 32 of ``bits`` (8 or 4) bits,
    in the kernel's panels."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int) -> None:
        super().__init__()
        qp, dp, mp = to_panels(*quantize(weight, bits))
        self.register_buffer("qp", qp, persistent=False)
        self.register_buffer("dp", dp, persistent=False)
        self.register_buffer("mp", mp, persistent=False)
        b = None if bias is None else bias.detach().float().contiguous()
        self.register_buffer("bias", b, persistent=False)
        self.out_features, self.bits = weight.shape[0], bits

    def dequantized(self) -> torch.Tensor:
        """The float32 [out, in] weight this layer computes with."""
        return dequantize(*from_panels(self.qp, self.dp, self.mp, self.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the op (a few µs of dispatch) inside graphs and under torch.profiler, where it is
        # named ``warmpath::linear_q``; the direct call otherwise
        if torch._C._autograd._profiler_enabled() or torch.compiler.is_compiling():
            return torch.ops.warmpath.linear_q(x, self.qp, self.dp, self.mp, self.bias, self.out_features)
        return linear(x, self.qp, self.dp, self.mp, self.bias, self.out_features)

"""Quantized linear layers for CPU decode: fbgemm dynamic int8 and fbgemm fp16 weights.

Modes (``--quantization``):

* ``none``  — the float32 reference path (``Linear``: ``x @ W^T``).
* ``fp16w`` — weights stored as float16, computed in float32 by fbgemm
  (``linear_dynamic_fp16``): half the weight bytes, near-reference logits.
* ``int8w`` — weights int8 in groups of 32 with a half scale each (GGML's Q8_0), activations
  float32, computed by warmpath's own C kernel (``models/qlinear_op.py``): 53% of ``fp16w``'s
  weight bytes, batch-invariant.
* ``int4w`` — the linears 4-bit in groups of 32 with a half scale and offset each (GGML's
  Q4_1), the LM head as ``int8w``: 36% of ``fp16w``'s bytes on SmolLM2. The default SmolLM2
  file is Q4_1 with a Q8_0 embedding, so its weights come back bit for bit.
* ``int8a8`` / ``int4a8`` — ``int8w`` / ``int4w``'s weights times activations rounded per row to
  int8 in groups of 32, integer dot products (``models/qlinear_a8_op.py``; llama.cpp's Q8_0 /
  Q4_1 × Q8_1 arithmetic): batch-invariant, answers near ``int4w``'s. The norms and SiLU run
  in C too (``models/fused_op.py``: one call where torch dispatches five to seven operators).
* ``int8``  — weights int8 per output channel, activations quantized per step to
  uint8 per tensor by fbgemm (``linear_dynamic``): a quarter of the weight bytes and
  integer matmuls. Per-tensor activation scales lose the small channels next to
  SmolLM2's large activation outliers, so each layer first divides its input by a
  per-input-channel factor ``s`` and multiplies its weight columns by it
  (SmoothQuant, Xiao et al. 2023: ``s = amax_x^α / amax_w^(1-α)``), with ``amax_x``
  measured once at load on a fixed calibration text. Two costs, measured on SmolLM2
  (``benchmarks/engine/engine.py``): greedy answers differ from the reference from the first
  tokens, and the activation scale spans every token of a step, so a request's answer
  depends on its batch mates. Opt-in only.

The LM head is quantized too (for tied embeddings a separate head is built; the
embedding table stays float32 for the lookup). The quantized kernels are CPU kernels:
``auto`` means ``fp16w`` on CPU (batch-invariant, greedy answers equal to the reference
on the test prompts) and ``none`` elsewhere. How the modes compare in speed
and agreement with the reference is measured in ``benchmarks/engine/engine.py``.
"""

from __future__ import annotations

import itertools
import os
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from warmpath.models.llama import Linear, LlamaForCausalLM
from warmpath.models.qlinear_a8_op import QA8Linear
from warmpath.models.qlinear_op import QLinear

QUANT_MODES = ("none", "int8", "fp16w", "int8w", "int4w", "int8a8", "int4a8")
SMOOTH_ALPHA = 0.5

# Fixed calibration text: prose, code and a chat turn, as the workloads mix them.
CALIBRATION_TEXT = """<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Explain how a hash map handles collisions, then write a Python function that merges two
sorted lists.<|im_end|>
<|im_start|>assistant
A hash map stores each key in a bucket chosen by its hash. When two keys land in the same
bucket, the map either chains them in a small list or probes for the next free slot.
def merge(a: list[int], b: list[int]) -> list[int]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]
The capital of France is Paris. Photosynthesis turns light, water and carbon dioxide into
sugar and oxygen. SELECT name, COUNT(*) FROM orders GROUP BY name ORDER BY 2 DESC;
import numpy as np
x = np.linspace(0, 1, 100)  # 100 points
print(f"{x.mean():.3f}")
"""


def resolve_mode(mode: str, device: torch.device) -> str:
    """``auto`` → ``fp16w`` on CPU, ``none`` elsewhere; other modes are checked and kept.

    Raises:
        ValueError: for an unknown mode, or a quantized mode on a non-CPU device.
    """
    if mode == "auto":
        return "fp16w" if device.type == "cpu" else "none"
    if mode not in QUANT_MODES:
        raise ValueError(f"quantization must be auto, {', '.join(QUANT_MODES)}; got {mode!r}")
    if mode != "none" and device.type != "cpu":
        raise ValueError(f"--quantization {mode} uses fbgemm or warmpath CPU kernels; use none on {device.type}")
    return mode


class Int8Linear(nn.Module):
    """``y = Q(x / s) · Q(W · s)^T + b`` with fbgemm's dynamic int8 GEMM.

    ``weight``: [out, in] float32; ``act_amax``: [in] largest |x| per input channel seen
    in calibration.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 act_amax: torch.Tensor, alpha: float = SMOOTH_ALPHA) -> None:
        super().__init__()
        w_amax = weight.abs().amax(dim=0).clamp(min=1e-5)
        s = (act_amax.clamp(min=1e-5) ** alpha / w_amax ** (1 - alpha)).clamp(min=1e-5)
        self.register_buffer("inv_s", (1.0 / s).float(), persistent=False)
        w = (weight * s).float().contiguous()
        scale = (w.abs().amax(dim=1).clamp(min=1e-8) / 127.0).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        b = None if bias is None else bias.detach().float().contiguous()
        self._packed = torch.ops.quantized.linear_prepack(q, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x * self.inv_s, self._packed, False)


# fbgemm's packed fp16 weights are TorchScript objects, which a torch.compile graph cannot take
# (dynamo breaks the graph at each such call). Inside a graph a layer's weight is named by a
# one-element tensor key into this table, and ``warmpath::linear_fp16`` (one opaque node, the
# same fbgemm kernel as eager) looks it up: a tensor, so one graph serves every layer.
_PACKED: dict[int, object] = {}
_KEYS = itertools.count()
_LIB = torch.library.Library("warmpath", "FRAGMENT")
_LIB.define("linear_fp16(Tensor x, Tensor key, int out_features) -> Tensor")
_LIB.impl("linear_fp16", lambda x, key, out: torch.ops.quantized.linear_dynamic_fp16(
    x, _PACKED[int(key)]), "CPU")
_LIB.impl("linear_fp16", lambda x, key, out: x.new_empty(*x.shape[:-1], out), "Meta")


class Fp16Linear(nn.Module):
    """``y = x · W^T + b`` with W stored as float16 (fbgemm), computed in float32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        b = None if bias is None else bias.detach().float().contiguous()
        self._packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), b)
        self.out_features = weight.shape[0]
        key = next(_KEYS)
        _PACKED[key] = self._packed
        self.register_buffer("packed_key", torch.tensor(key), persistent=False)
        weakref.finalize(self, _PACKED.pop, key, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.warmpath.linear_fp16(x, self.packed_key, self.out_features)
        return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)


@torch.inference_mode()
def input_amax(model: LlamaForCausalLM, token_ids: list[int], block_size: int = 16
               ) -> dict[str, torch.Tensor]:
    """Largest |input| per channel of every ``Linear`` (and ``"lm_head"``) over one prefill."""
    amax: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_mod, inp, _out):
            a = inp[0].detach().abs().amax(dim=0).float()
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, Linear)]
    try:
        hidden = model.prefill_once(token_ids, block_size)
    finally:
        for h in handles:
            h.remove()
    amax["lm_head"] = hidden.abs().amax(dim=0).float()
    return amax


def quantize_model(model: LlamaForCausalLM, mode: str, calibration_ids: list[int]) -> int:
    """Replace every ``Linear`` and the LM head by ``mode``'s layer, in place.

    Returns how many layers were replaced (0 for ``none``). The float32 weights of the
    replaced layers are dropped; the embedding table stays float32.
    """
    if mode == "none":
        return 0
    model = model.float()
    amax = input_amax(model, calibration_ids) if mode == "int8" else {}

    def build(weight: torch.Tensor, bias: torch.Tensor | None, name: str) -> nn.Module:
        if mode == "int8":
            return Int8Linear(weight, bias, amax[name])
        if mode in ("int8w", "int4w", "int8a8", "int4a8"):   # the LM head keeps 8 bits, as GGUF files do
            bits = 4 if mode.startswith("int4") and name != "lm_head" else 8
            return (QA8Linear if mode.endswith("a8") else QLinear)(weight, bias, bits)
        return Fp16Linear(weight, bias)

    swaps = [(parent, child_name, f"{pname}.{child_name}" if pname else child_name, child)
             for pname, parent in model.named_modules()
             for child_name, child in parent.named_children() if isinstance(child, Linear)]
    jobs = [(child.weight_t.detach().t(), None if child.bias is None else child.bias.detach(), full)
            for _parent, _name, full, child in swaps]
    head_w = model.embed_tokens.weight.detach() if model.lm_head is None else None
    if head_w is None and not isinstance(model.lm_head, (Int8Linear, Fp16Linear, QLinear, QA8Linear)):
        head_w = model.lm_head.weight_t.detach().t()
    if head_w is not None:
        jobs.append((head_w, None, "lm_head"))
    # fbgemm's prepack releases the GIL: pack on every CPU this process may use (a worker
    # pinned to one core packs on that core) — the largest part of a worker's start.
    # The packed layers are the same whatever the order they were built in.
    with ThreadPoolExecutor(max(1, min(8, len(os.sched_getaffinity(0))))) as pool:
        built = pool.map(lambda job: build(*job), jobs)
        for parent, child_name, _full, _child in swaps:   # in order, each float32 weight let go at once
            setattr(parent, child_name, next(built))
        if head_w is not None:
            model.lm_head = next(built)
    model.fused = mode.endswith("a8")     # llama.cpp's arithmetic: the norms and SiLU in C too
    return len(swaps) + 1

"""A compiled decode step: ``torch.compile`` (inductor) of each layer's work.

Used for steps made only of decodes (steps with a prefill chunk run eager). On CPU with
float32 caches a whole layer is one compiled function (``_layer``): its attention is the C
kernel's op (``paged_decode_op``: one opaque node that writes the step's K/V rows and attends
in place; padding rows get slot −1). Elsewhere two compiled functions run per layer:
``_pre`` (RMSNorm, fused QKV projection, RoPE) and ``_post`` (attention as index arithmetic,
output projection, residuals, RMSNorm, MLP), the K/V rows written eagerly between them.
fbgemm's fp16 linears enter the graph as ``warmpath::linear_fp16`` (``quant.py``). The same two graphs serve
all layers (parameters, and the fp16 linears' packed weights, are graph inputs: one
graph, no recompilation per layer — checked with dynamo's compile counter).

Batches are padded to buckets (``BUCKETS``: 2, 4, 8, …; 2 and not 1 so that a sequence
alone and in a batch run the same kernels, keeping answers batch-invariant); on CPU the
batch and block-table width are dynamic dimensions (the cache and weights static), so
buckets and widths share the graphs;
on CUDA they are static per bucket and captured as CUDA graphs (``reduce-overhead``), the
table width padded to a power of two. NOTE: the CUDA path is present but untested here
(no GPU on the development machine).

Attention inside ``_post`` (``decode_attention_indexed``) indexes K/V through the block
table as index arithmetic; inductor fuses the lookup into the reductions, so blocks are
read where they lie. Inductor's compiled code is cached on disk (``cache_dir``).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from warmpath.models import paged_decode_op
from warmpath.models.attention import AttentionMetadata
from warmpath.models.llama import LlamaForCausalLM, RotaryEmbedding

COMPILE_MODES = ("off", "on")
BUCKETS = (2, 4, 8, 16, 32, 64, 128, 256, 512)
log = logging.getLogger(__name__)


def bucket(n: int) -> int:
    """The smallest bucket holding ``n`` sequences (``n`` itself above the last bucket)."""
    return next((b for b in BUCKETS if b >= n), n)


def cache_dir() -> str:
    """Point inductor's on-disk cache at ``$WARMPATH_INDUCTOR_CACHE_DIR``, else
    ~/.cache/warmpath/inductor, and return it.

    NOTE: importing ``torch._inductor`` already sets ``TORCHINDUCTOR_CACHE_DIR`` (to
    /tmp/torchinductor_<user>, lost on reboot), so a default cannot be left to it; inductor
    reads the variable at each use, so setting it before the first compile suffices.
    """
    d = os.environ.get("WARMPATH_INDUCTOR_CACHE_DIR") or str(
        Path.home() / ".cache" / "warmpath" / "inductor")
    Path(d).mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    return d


# One query per row through the block table by index arithmetic (eager it materialises the
# lookups; compiled, inductor fuses them into the reductions): the CUDA path's attention.
decode_attention_indexed = paged_decode_op.indexed_attention


def _pre(layer, x, cos, sin):
    a = layer.self_attn
    t = x.shape[0]
    q, k, v = a.qkv_proj(layer.input_layernorm(x)).split([a.q_size, a.kv_size, a.kv_size], dim=-1)
    return (RotaryEmbedding.apply(q.view(t, a.h, a.dh), cos, sin),
            RotaryEmbedding.apply(k.view(t, a.kvh, a.dh), cos, sin), v.view(t, a.kvh, a.dh))


def _post(layer, x, q, k_cache, v_cache, tables, ctx):
    a = layer.self_attn
    o = decode_attention_indexed(q, k_cache, v_cache, tables, ctx, a.scale)
    x = x + a.o_proj(o.reshape(x.shape[0], a.q_size))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _layer(layer, x, cos, sin, k_cache, v_cache, slots, tables, ctx):
    """A whole layer as one graph: the step's K/V written and attended by the native op."""
    a = layer.self_attn
    q, k, v = _pre(layer, x, cos, sin)
    o = paged_decode_op.paged_decode(q, k, v, k_cache, v_cache, slots, tables, ctx, a.scale)
    x = x + a.o_proj(o.reshape(x.shape[0], a.q_size))
    return x + layer.mlp(layer.post_attention_layernorm(x))


class CompiledDecode:
    """Runs a decode-only step through the compiled per-layer functions."""

    def __init__(self, model: LlamaForCausalLM, device: torch.device) -> None:
        self.model, self.device = model, device
        self.cuda = device.type == "cuda"
        self.cache_dir = cache_dir()
        opts = {"mode": "reduce-overhead", "dynamic": False} if self.cuda else {}
        # CPU float32 with the C kernel: one graph per layer (the kernel writes the K/V rows);
        # otherwise two, the rows written eagerly between them
        self.native = (paged_decode_op.available() and device.type == "cpu"
                       and next(model.parameters()).dtype == torch.float32)
        if self.native:
            self.layer = torch.compile(_layer, **opts)
        else:
            self.pre = torch.compile(_pre, **opts)
            self.post = torch.compile(_post, **opts)
        self.compile_seconds = 0.0          # wall time of warm-up (compiles, or cache loads)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Like ``LlamaForCausalLM.forward`` for a step of ``meta.decode.n`` decodes only."""
        dec, m = meta.decode, self.model
        n, bb = dec.n, bucket(dec.n)
        w = max(len(t) for t in dec.tables)
        if self.cuda:       # a new step: the graphs' previous outputs are dead
            torch.compiler.cudagraph_mark_step_begin()
            w = 1 << (w - 1).bit_length()
        if dec.table_tensor is not None and not self.cuda:   # the step's tensors, padded to the bucket
            tables = torch.nn.functional.pad(dec.table_tensor, (0, 0, 0, bb - n))
            ctx = torch.nn.functional.pad(dec.ctx_tensor, (0, bb - n), value=1)
        else:
            tables = torch.tensor([t + [0] * (w - len(t)) for t in dec.tables] + [[0] * w] * (bb - n),
                                  dtype=torch.long, device=self.device)
            ctx = torch.tensor(dec.ctx + [1] * (bb - n), dtype=torch.long, device=self.device)
        pad = torch.zeros(bb - n, dtype=torch.long, device=self.device)
        x = m.embed_tokens(torch.cat([input_ids, pad]))
        cos, sin = m.rope(torch.cat([positions, pad]), x.dtype)
        slots = meta.slot_mapping
        dyn = (lambda t: torch._dynamo.maybe_mark_dynamic(t, 0)) if not self.cuda else (lambda t: None)
        # CPU: one graph for every bucket and width; the cache and the weights are static
        for t in (cos, sin, tables, ctx):
            dyn(t)
        if not self.cuda:
            torch._dynamo.maybe_mark_dynamic(tables, 1)
        if self.native:
            slots = torch.cat([slots, torch.full((bb - n,), -1, dtype=torch.long, device=self.device)])
            dyn(slots)
            for i, layer in enumerate(m.layers):
                dyn(x)
                x = self.layer(layer, x, cos, sin, kv_caches[i][0], kv_caches[i][1], slots, tables, ctx)
            return m.norm(x[:n])
        for i, layer in enumerate(m.layers):
            kc, vc = kv_caches[i][0], kv_caches[i][1]
            dyn(x)
            q, k, v = self.pre(layer, x, cos, sin)
            dyn(q)
            kc.view(-1, k.shape[1], k.shape[2]).index_copy_(0, slots, k[:n].to(kc.dtype))
            vc.view(-1, v.shape[1], v.shape[2]).index_copy_(0, slots, v[:n].to(vc.dtype))
            x = self.post(layer, x, q, kc, vc, tables, ctx)
        return m.norm(x[:n])

    @torch.inference_mode()
    def warmup(self, kv_caches: torch.Tensor, block_size: int, max_batch: int) -> float:
        """Compile (or load from the cache) every bucket up to ``max_batch`` and table widths
        1 and 2, writing only slot 0 (call before any request). Returns the seconds spent."""
        t0 = time.perf_counter()
        for bb in sorted({bucket(b) for b in BUCKETS if b <= bucket(max_batch)}):
            for w in (1, 2):
                meta = AttentionMetadata.build(block_size, [[0] * w] * bb, [1] * bb, [], [0] * bb,
                                               self.device)
                zeros = torch.zeros(bb, dtype=torch.long, device=self.device)
                self.forward(zeros, zeros, kv_caches, meta)
        kv_caches[:, :, 0].zero_()
        self.compile_seconds = time.perf_counter() - t0
        log.info("compiled decode step: %.1f s for buckets up to %d (inductor cache %s)",
                 self.compile_seconds, bucket(max_batch), self.cache_dir)
        return self.compile_seconds

"""Llama-family decoder (Llama, Qwen2, Mistral, SmolLM) over a paged KV cache.

Shapes: T = tokens in the step (all sequences flattened), D = hidden size,
H / KVH = query / key-value heads, Dh = head dim.
"""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from warmpath.models.attention import AttentionMetadata, paged_attention
from warmpath.models.fused_op import add_rmsnorm, silu_mul
from warmpath.models.rope_op import rope_qk
from warmpath.models.config import ModelConfig, RopeScaling


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [Dh/2], with Llama-3 / linear scaling applied."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs: RopeScaling = cfg.rope_scaling
    if rs.rope_type == "linear":
        inv = inv / rs.factor
    elif rs.rope_type == "llama3":
        low_wl = rs.original_max_position_embeddings / rs.low_freq_factor
        high_wl = rs.original_max_position_embeddings / rs.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / rs.factor, inv)
        smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
            rs.high_freq_factor - rs.low_freq_factor)
        mid = (1 - smooth) * scaled / rs.factor + smooth * scaled
        is_mid = (wavelen >= high_wl) & (wavelen <= low_wl)
        inv = torch.where(is_mid, mid, scaled)
    return inv.float()


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate halves) with a cos/sin cache."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        t = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, rope_inv_freq(cfg))           # [P, Dh/2]
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for the step's positions [T] → each [T, 1, Dh/2] (gathered once per step)."""
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.sin[positions].unsqueeze(1).to(dtype))

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [T, heads, Dh]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Linear(nn.Module):
    """``y = x @ W^T + b`` with W stored transposed ([in, out]).

    NOTE: on CPU, MKL streams a [in, out] weight ~2x faster than PyTorch's usual
    [out, in] layout for the skinny matmuls of decode (measured in
    benchmarks/engine/engine.py); prefill-sized matmuls run at the same speed.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.h, self.kvh, self.dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.h * self.dh, self.kvh * self.dh
        # Fused q|k|v projection.
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=False)
        self.scale = self.dh ** -0.5

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        rotated = rope_qk(qkv, *rope, self.h, self.kvh, self.dh)     # the same bits, one C call
        if rotated is None:
            rotated = (RotaryEmbedding.apply(q.view(t, self.h, self.dh), *rope),
                       RotaryEmbedding.apply(k.view(t, self.kvh, self.dh), *rope))
        q, k = rotated
        v = v.view(t, self.kvh, self.dh)
        o = paged_attention(q, k, v, kv_cache, meta, self.scale)  # [T, H, Dh]
        return self.o_proj(o.reshape(t, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.inter, bias=False)  # fused
        self.down_proj = Linear(self.inter, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, kv_cache, meta):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, x: torch.Tensor, h: torch.Tensor | None, rope, kv_cache, meta) -> torch.Tensor:
        """The layer with its elementwise work in ``fused_op``'s calls: ``x += h`` (the layer
        before's MLP output) and this layer's attention output in place; returns this layer's
        MLP output (the next layer, or the final norm, adds it). The same sums as ``forward``."""
        n1, n2, mlp = self.input_layernorm, self.post_attention_layernorm, self.mlp
        a = self.self_attn.forward(add_rmsnorm(x, h, n1.weight, n1.eps), rope, kv_cache, meta)
        gu = mlp.gate_up_proj.forward(add_rmsnorm(x, a, n2.weight, n2.eps))
        return mlp.down_proj.forward(silu_mul(gu, mlp.inter))


class LlamaForCausalLM(nn.Module):
    """The decoder plus LM head; logits are computed only for the rows asked for."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # set by quant.quantize_model for the int8-activation modes: forward runs forward_fused
        self.fused = False
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = RotaryEmbedding(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(
            cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [T]; kv_caches: [L, 2, blocks, bs, KVH, Dh] → hidden [T, D]."""
        x = self.embed_tokens(input_ids)
        rope = self.rope(positions, x.dtype)
        if self.fused:          # the int8-activation modes: norms and SiLU in C (fused_op)
            h = None
            for i, layer in enumerate(self.layers):
                h = layer.forward_fused(x, h, rope, kv_caches[i], meta)
            return add_rmsnorm(x, h, self.norm.weight, self.norm.eps)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, kv_caches[i], meta)
        return self.norm(x)

    def prefill_once(self, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
        """hidden [T, D] of one sequence prefilled whole into a fresh KV cache of its own, on
        CPU (calibration and evaluation, not serving)."""
        cfg, t = self.cfg, len(token_ids)
        nblocks = -(-t // block_size)
        kv = torch.zeros(cfg.num_layers, 2, nblocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        meta = AttentionMetadata.build(block_size, [], [], [(t, t, list(range(nblocks)))],
                                       list(range(t)), torch.device("cpu"))
        return self(torch.tensor(token_ids), torch.arange(t), kv, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] → float32 logits [N, V]."""
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return F.linear(hidden, self.embed_tokens.weight).float()

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Load weights named as in Hugging Face Llama checkpoints (fusing q/k/v, gate/up).

        The tensors become the parameters (``assign``; the model may be on the meta device):
        each fused or transposed weight is built with one copy, and the others (embedding,
        norms) are taken as they are, so views of a memory-mapped file stay views of it.
        """
        sd = {k.removeprefix("model."): v for k, v in sd.items()}
        own = self.state_dict()
        parts: dict[str, list[torch.Tensor]] = {}    # our name -> HF tensors joined along dim 0
        for i in range(self.cfg.num_layers):
            a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            parts[a + "qkv_proj.weight"] = [sd.pop(a + n + "_proj.weight") for n in ("q", "k", "v")]
            if self.cfg.attention_bias:
                parts[a + "qkv_proj.bias"] = [sd.pop(a + n + "_proj.bias") for n in ("q", "k", "v")]
            parts[m + "gate_up_proj.weight"] = [sd.pop(m + "gate_proj.weight"), sd.pop(m + "up_proj.weight")]
        if self.lm_head is None:
            sd.pop("lm_head.weight", None)
        parts.update((k, [v]) for k, v in sd.items())
        new: dict[str, torch.Tensor] = {}
        for k, ts in parts.items():
            kt = k.removesuffix(".weight") + ".weight_t"
            if k.endswith(".weight") and kt in own:     # Linear keeps W^T [in, out]
                new[kt] = ts[0].t().contiguous() if len(ts) == 1 else torch.cat([t.t() for t in ts], dim=1)
            else:
                new[k] = ts[0] if len(ts) == 1 else torch.cat(ts)
        missing = set(own) - set(new)
        unexpected = set(new) - set(own)
        if missing or unexpected:
            raise ValueError(f"checkpoint mismatch: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        for k, v in new.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"shape mismatch for {k}: {tuple(v.shape)} vs {tuple(own[k].shape)}")
        self.load_state_dict(new, strict=True, assign=True)

"""A decoder's shape for the simulator, from any Hugging Face ``config.json`` (pure data).

What the step-time model needs of a model: the bytes of its weights (in their precision), the
KV bytes per token, and the FLOPs of a step — linear layers per token (the active experts'
only, for a mixture of experts), the LM head once per sequence (engines compute logits for
the last token of each scheduled sequence only), attention quadratic in the context. Llama,
Mistral, Qwen2/Qwen3, Mixtral and Qwen-MoE configs are read; bundled copies of common ones are in
``warmpath/sim/models/`` (``MODELS``), any other is named by its path.

Precision: ``dtype_bytes`` 2 (BF16/FP16) or 1 (FP8 weights and activations, as vLLM's ``fp8``
quantisation on Hopper/Blackwell: the linear layers' GEMMs run at the FP8 peak; embeddings and
the LM head stay in BF16). ``kv_dtype_bytes``: the KV cache's (0: as the weights' but at least
2 — an FP8 model keeps a BF16 cache unless told otherwise).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

BUNDLED = Path(__file__).with_name("models")
PRECISION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelProfile:
    """Shape of a decoder. Without ``intermediate`` (a hand-made profile) every parameter counts
    as a linear layer for every token (``2·params`` FLOPs per token)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params: float
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 0               # the KV cache's element bytes (0: the weights', at least 2)
    intermediate: int = 0                 # dense MLP width (0: unknown, see above)
    vocab: int = 0
    tied: bool = False
    experts: int = 0                      # routed experts per layer (0: a dense model)
    experts_per_tok: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0          # an always-active shared expert's width (Qwen2-MoE)

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim) <= 0 or self.params <= 0:
            raise ValueError(f"model {self.name}: layers, widths, heads and params must be > 0")
        if self.dtype_bytes not in (1, 2, 4) or self.kv_dtype_bytes not in (0, 1, 2, 4):
            raise ValueError(f"model {self.name}: element bytes must be 1, 2 or 4")
        if self.experts and not 0 < self.experts_per_tok <= self.experts:
            raise ValueError(f"model {self.name}: experts_per_tok must be in [1, experts]")

    # -- sizes -----------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        kv = self.kv_dtype_bytes or max(2, self.dtype_bytes)
        return 2 * self.layers * self.kv_heads * self.head_dim * kv

    @property
    def attn_params(self) -> int:
        """Q, K, V and O projections of one layer."""
        q = self.heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def embed_params(self) -> int:
        """Embedding table plus LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def expert_params(self) -> int:
        """Routed experts' weights over all layers (0: dense)."""
        return self.layers * self.experts * 3 * self.hidden * self.expert_intermediate

    @property
    def active_linear_params(self) -> float:
        """Linear-layer weights one token goes through, the LM head apart."""
        if not self.intermediate and not self.experts:
            return self.params
        mlp = 3 * self.hidden * (self.experts_per_tok * self.expert_intermediate + self.shared_intermediate
                                 if self.experts else self.intermediate)
        return self.layers * (self.attn_params + mlp + self.hidden * self.experts)

    @property
    def weight_bytes(self) -> float:
        """All weights as stored on the GPUs: linear layers at ``dtype_bytes``, embeddings and
        LM head at BF16 when the linear layers are FP8."""
        emb = min(self.embed_params, self.params)
        return (self.params - emb) * self.dtype_bytes + emb * max(2, self.dtype_bytes)

    # -- one step -------------------------------------------------------------
    def linear_flops(self, tokens: int, seqs: int) -> float:
        """FLOPs of the linear layers for ``tokens`` tokens of ``seqs`` sequences (LM head once each)."""
        head = self.vocab * self.hidden if self.vocab else 0
        return 2.0 * self.active_linear_params * tokens + 2.0 * head * seqs

    def attention_flops(self, items: list[tuple[int, int]]) -> float:
        """QKᵀ and PV for ``(new, context)`` items: ``new`` tokens over ``context + new/2`` on average."""
        return sum(4.0 * self.layers * self.heads * self.head_dim * n * (c + n / 2) for n, c in items)

    def step_weight_bytes(self, tokens: int) -> float:
        """Weights a step of ``tokens`` tokens reads: all, but only the experts it routes to —
        each of a layer's experts is touched with probability 1 − (1 − k/E)^tokens."""
        if not self.experts:
            return self.weight_bytes
        touched = 1.0 - (1.0 - self.experts_per_tok / self.experts) ** max(1, tokens)
        experts = self.expert_params * self.dtype_bytes
        return self.weight_bytes - experts + experts * touched

    def with_precision(self, weights: str | None = None, kv: str | None = None) -> "ModelProfile":
        """The same model with its weights and/or KV cache in ``bf16``/``fp16``/``fp8``."""
        for what, v in (("weights", weights), ("kv", kv)):
            if v is not None and v not in PRECISION_BYTES:
                raise ValueError(f"{what} precision: one of {', '.join(PRECISION_BYTES)}, got {v!r}")
        return replace(self, dtype_bytes=PRECISION_BYTES[weights] if weights else self.dtype_bytes,
                       kv_dtype_bytes=PRECISION_BYTES[kv] if kv else self.kv_dtype_bytes)


def _get(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def from_config(cfg: dict, name: str) -> ModelProfile:
    """A profile from a Hugging Face ``config.json`` dict (a multimodal config's ``text_config``
    is read). Parameters are counted from the shapes; ``torch_dtype`` float32 keeps 4 bytes."""
    cfg = cfg.get("text_config") or cfg
    try:
        hidden, layers, heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{name}: not a decoder config.json (missing or bad {e})") from None
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    moe_every = int(_get(cfg, "decoder_sparse_step", default=1))
    if experts and moe_every != 1:
        raise ValueError(f"{name}: MoE on every {moe_every}th layer is not modelled")
    inter = int(_get(cfg, "intermediate_size", default=0))
    p = ModelProfile(name, layers, hidden, heads, kv_heads, head_dim, 1.0,
                     dtype_bytes=4 if cfg.get("torch_dtype") == "float32" else 2,
                     intermediate=inter if not experts else 0, vocab=int(cfg.get("vocab_size", 0)),
                     tied=bool(cfg.get("tie_word_embeddings", False)),
                     experts=experts, experts_per_tok=int(_get(cfg, "num_experts_per_tok", default=0)),
                     expert_intermediate=int(_get(cfg, "moe_intermediate_size", default=inter)) if experts else 0,
                     shared_intermediate=int(_get(cfg, "shared_expert_intermediate_size", default=0)))
    if not (p.intermediate or p.experts):
        raise ValueError(f"{name}: config.json has no intermediate_size")
    mlp = 3 * hidden * (p.intermediate + p.shared_intermediate) + 3 * hidden * p.expert_intermediate * experts
    params = layers * (p.attn_params + mlp + hidden * experts) + p.embed_params
    return replace(p, params=float(params))


@cache
def bundled() -> dict[str, ModelProfile]:
    """The configs shipped in ``warmpath/sim/models/`` by file stem."""
    return {f.stem: from_config(json.loads(f.read_text()), f.stem) for f in sorted(BUNDLED.glob("*.json"))}


def model_profile(name: str) -> ModelProfile:
    """A model of ``MODELS`` by name, or a ``config.json`` (or a folder holding one) by path."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"--model {name!r}: not a bundled model ({', '.join(bundled())}) nor a config.json")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--model {name}: cannot read {path} ({e})") from None
    return from_config(cfg, path.parent.name if path.name == "config.json" else path.stem)


def _models() -> dict[str, ModelProfile]:
    out = dict(bundled())
    # the embedded default as this CPU runs it (float32 weights and KV); its steps come from a calibration
    out["smollm2-135m"] = replace(out["smollm2-135m"], dtype_bytes=4) if "smollm2-135m" in out else \
        ModelProfile("smollm2-135m", 30, 576, 9, 3, 64, 134.5e6, dtype_bytes=4)
    return out


MODELS = _models()
"""The simulator's models by name: the bundled configs, SmolLM2-135M as the CPU engine runs it."""

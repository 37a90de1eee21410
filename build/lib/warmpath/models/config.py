"""Model architecture config (one frozen dataclass for the Llama family)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style rope scaling (``rope_type == "llama3"``); ``factor == 1`` is none."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("default", "llama3", "linear"):
            raise ValueError(f"unsupported rope_scaling type {self.rope_type!r}")
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder (Llama, Qwen2, Mistral, SmolLM)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V for one token over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (Llama/Qwen2/Mistral)."""
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        known = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                 "Qwen2ForCausalLM": "qwen2"}
        if arch not in known:
            raise ValueError(f"unsupported architecture {arch!r}; supported: {sorted(known)}")
        # transformers >= 5 writes ``rope_parameters`` (with rope_theta inside).
        rp = cfg.get("rope_parameters") or {}
        rs = cfg.get("rope_scaling") or rp
        rope_type = rs.get("rope_type", rs.get("type", "default")) if rs else "default"
        scaling = RopeScaling(
            rope_type=rope_type, factor=float(rs.get("factor", 1.0)),
            low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(rs.get("original_max_position_embeddings", 8192)),
        ) if rs else RopeScaling()
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rope_theta=float(cfg.get("rope_theta", rp.get("rope_theta", 10000.0))),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=known[arch] == "qwen2" or bool(cfg.get("attention_bias", False)),
            rope_scaling=scaling, bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids,
            architecture=known[arch],
        )


def tiny_config(vocab_size: int = 512) -> ModelConfig:
    """A tiny random-weight config for fast unit tests."""
    return ModelConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                       max_position_embeddings=2048, rope_theta=10000.0,
                       tie_word_embeddings=True, eos_token_ids=(1,), architecture="llama")

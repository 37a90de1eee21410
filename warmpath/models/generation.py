"""A model's default sampling parameters, and the order in which they are decided.

For each parameter a request leaves out, the first of these that sets it wins:

1. the operator's ``--override-generation-config`` (JSON, vLLM's flag and key names);
2. the model's own generation config: ``generation_config.json`` of an HF directory, or a
   GGUF file's ``general.sampling.*`` keys (written into the converted directory's
   ``generation_config.json``);
3. :data:`MODEL_TABLE`: per model, its card's recommendation (plus what we measured)
   when its files say nothing;
4. :data:`NEUTRAL`: temperature 1, top_p 1, no top_k / min_p / repetition penalty.

A request's own value always wins over all of them (``protocol.openai`` resolves it).
Keys are Hugging Face generation-config names; ``max_new_tokens`` becomes the default
``max_tokens`` (else the server's ``--default-max-tokens``; a worker always caps it at the
context left). As vLLM, ``do_sample`` is not read: ``temperature`` alone decides greedy.

NOTE: no torch here (the CLI parses the flag with it; the router shows what workers report).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
CONFIG_KEYS = SAMPLING_KEYS + ("max_new_tokens",)
MAX_TEMPERATURE = 2.0            # as the API's own bound
MAX_REPETITION_PENALTY = 10.0    # as the API's own bound (1.0-1.3 is the useful range)
MIN_REPETITION_PENALTY = 1 / MAX_REPETITION_PENALTY
NEUTRAL: dict[str, float | int] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                   "repetition_penalty": 1.0}
# llama.cpp's GGUF metadata keys (gguf.constants.Keys.General.SAMPLING_*) → HF names
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
             "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
             "general.sampling.penalty_repeat": "repetition_penalty"}
# (substrings all in the lower-cased model id, values). SmolLM2-{135M,360M,1.7B}-Instruct: the
# card's generate(..., temperature=0.2, top_p=0.9, do_sample=True) (its generation_config.json
# has no sampling keys, the GGUF no general.sampling.*). With those alone 11 of 30 answers to
# the README's question (135M, max_tokens 96) fell into a loop ("la femme, la femme, …") up to
# the cap; with repetition_penalty 1.1, 0 of 30 (1.2 made answers ramble; docs/api.md, "Defaults").
MODEL_TABLE: tuple[tuple[tuple[str, ...], dict[str, float | int]], ...] = (
    (("smollm2", "instruct"), {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1}),
)


def _check(key: str, v: Any, where: str) -> float | int:
    """One value, type- and range-checked; ``top_k`` -1 (off) becomes 0 (off)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where}: {key} must be a finite number, got {v!r}")
    ok = {"temperature": 0 <= v <= MAX_TEMPERATURE, "top_p": 0 < v <= 1, "min_p": 0 <= v <= 1,
          "repetition_penalty": MIN_REPETITION_PENALTY <= v <= MAX_REPETITION_PENALTY,
          "top_k": isinstance(v, int) and v >= -1, "max_new_tokens": isinstance(v, int) and v >= 1}[key]
    if not ok:
        rule = {"temperature": f"in [0, {MAX_TEMPERATURE}]", "top_p": "in (0, 1]", "min_p": "in [0, 1]",
                "repetition_penalty": f"in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}]", "top_k": "an integer >= -1",
                "max_new_tokens": "an integer >= 1"}[key]
        raise ValueError(f"{where}: {key} must be {rule}, got {v!r}")
    return max(0, v) if key == "top_k" else v


def pick(config: Mapping[str, Any], where: str, strict: bool = True) -> dict[str, float | int]:
    """The sampling keys of an HF-style generation config (``None`` values skipped),
    checked; other keys (``bos_token_id``, ``do_sample``, …) are ignored. A bad value
    raises ``ValueError``, or with ``strict=False`` is left out with a warning."""
    out: dict[str, float | int] = {}
    for k in CONFIG_KEYS:
        if config.get(k) is None:
            continue
        try:
            out[k] = _check(k, config[k], where)
        except ValueError as e:
            if strict:
                raise
            log.warning("%s; ignored", e)
    return out


def parse_override(text: str) -> dict[str, float | int]:
    """``--override-generation-config``: a JSON object of :data:`CONFIG_KEYS` (others refused)."""
    where = "--override-generation-config"
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{where}: not JSON ({e})") from e
    return check_override(obj, where)


def check_override(obj: Any, where: str = "generation override") -> dict[str, float | int]:
    """An override object: only :data:`CONFIG_KEYS`, each in range (``ValueError`` naming it)."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"{where}: must be a JSON object, got {obj!r}")
    unknown = sorted(set(obj) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {list(CONFIG_KEYS)}")
    return pick(obj, where)


def read_generation_config(hf_dir: Path) -> dict[str, float | int]:
    """The sampling keys of ``hf_dir/generation_config.json`` ({} without the file); a value
    out of range, or a file that is not a JSON object, is ignored with a warning (the model
    still serves, with the next layer's default)."""
    path = hf_dir / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text())
    except ValueError as e:
        log.warning("%s: not JSON (%s); ignored", path, e)
        return {}
    return pick(obj, str(path), strict=False) if isinstance(obj, dict) else {}


def table_entry(model_id: str) -> dict[str, float | int]:
    """:data:`MODEL_TABLE`'s values for a model id ({} when no row matches)."""
    name = model_id.lower()
    return next((dict(v) for subs, v in MODEL_TABLE if all(s in name for s in subs)), {})


@dataclass(frozen=True)
class GenerationDefaults:
    """What a request that leaves a field out gets, and where each value came from
    (``sources``: field → ``--override-generation-config`` / the model's config / ``model
    table`` / ``neutral`` / ``--default-max-tokens``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 1024           # before the cap at the context left
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for k in SAMPLING_KEYS:
            _check(k, getattr(self, k), "generation defaults")
        _check("max_new_tokens", self.max_tokens, "generation defaults (max_tokens)")

    def sampling(self) -> dict[str, float | int]:
        """The five sampling values (what ``SamplingFields.sampling_kwargs`` fills in)."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS}

    def describe(self) -> str:
        """One line: each value with its source (what a worker prints when it starts)."""
        return ", ".join(f"{k} {v} ({self.sources.get(k, '?')})" for k, v in self.to_json().items() if k != "sources")

    def to_json(self) -> dict[str, Any]:
        """The values and their sources, as ``/v1/models`` and the registration show them."""
        return {**self.sampling(), "max_tokens": self.max_tokens, "sources": dict(self.sources)}


def resolve_defaults(override: Mapping[str, Any], model: Mapping[str, Any], table: Mapping[str, Any],
                     default_max_tokens: int, model_source: str = "generation_config.json"
                     ) -> GenerationDefaults:
    """Each field from the first layer that sets it: ``override`` > ``model`` (labelled
    ``model_source``) > ``table`` (:func:`table_entry`) > :data:`NEUTRAL` (``max_tokens``: ``max_new_tokens``, else
    ``default_max_tokens``)."""
    layers = (("--override-generation-config", override), (model_source, model), ("model table", table))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, out, fallback, label in [*((k, k, NEUTRAL[k], "neutral") for k in SAMPLING_KEYS),
                                      ("max_new_tokens", "max_tokens", default_max_tokens,
                                       "--default-max-tokens")]:
        values[out], sources[out] = next(((layer[key], name) for name, layer in layers
                                          if layer.get(key) is not None), (fallback, label))
    return GenerationDefaults(**values, sources=sources)

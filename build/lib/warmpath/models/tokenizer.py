"""Tokenizer + chat template (from ``tokenizer.json`` / ``tokenizer_config.json``)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import xxhash
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


class ChatTemplateError(ValueError):
    """The chat template rejected the messages."""


def _raise(msg: str) -> None:
    raise ChatTemplateError(msg)


class TextTokenizer:
    """Encode/decode text and render chat messages with the model's template."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        self.tk = tokenizer
        self.bos_token = config.get("bos_token")
        self.eos_token = config.get("eos_token")
        self.add_bos = bool(config.get("add_bos_token", False))
        self.bos_id = self.tk.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_id = self.tk.token_to_id(self.eos_token) if self.eos_token else None
        tmpl = config.get("chat_template")
        if isinstance(tmpl, list):  # HF allows [{"name": "default", "template": ...}]
            tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), None)
        self._template = None
        if tmpl:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent,
                                                                       ensure_ascii=False)
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(tmpl)
        vocab = self.tk.get_vocab()
        self.identity = xxhash.xxh3_64_hexdigest(
            json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())

    @classmethod
    def from_dir(cls, path: Path) -> "TextTokenizer":
        """Load ``tokenizer.json`` (+ optional ``tokenizer_config.json``) from a directory."""
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        for key in ("bos_token", "eos_token"):
            if isinstance(cfg.get(key), dict):
                cfg[key] = cfg[key].get("content")
        return cls(Tokenizer.from_file(str(path / "tokenizer.json")), cfg)

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size()

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text`` (special tokens in the text are recognised)."""
        ids = self.tk.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tk.decode(ids, skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True) -> str:
        """Render messages to the prompt text the model was trained on."""
        if self._template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        try:
            return self._template.render(messages=messages, bos_token=self.bos_token or "",
                                         eos_token=self.eos_token or "",
                                         add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e

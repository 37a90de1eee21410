"""``/internal/generate`` onto vLLM's ``/v1/completions``: the request as token ids with the
sampling fields the client sent, vLLM's SSE stream back in the shape warmpath's own workers answer.

The prompt travels as token ids (the router tokenized it, chat template included), so vLLM
computes exactly the tokens the router hashed. A sampling field the client left out is left out
for vLLM too, unless the operator's ``--override-generation-config`` or the model's own
``generation_config.json`` sets it (what vLLM started on the same model would apply itself, sent
explicitly): warmpath's model table (``models.generation.MODEL_TABLE``, e.g. SmolLM2's
repetition penalty 1.1) is warmpath's engine's choice, not vLLM's, so a request answers the same
behind warmpath as from vLLM alone (a greedy one token for token; a penalty changes even the
argmax). ``max_tokens`` is always explicit (the worker's ``--default-max-tokens``, which the router
books, capped at the context left). vLLM is always asked to stream (with usage): a non-streamed
answer is assembled here, and the first token's time is measured the same way for both.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from warmpath.models.generation import NEUTRAL, SAMPLING_KEYS, GenerationDefaults
from warmpath.protocol.errors import APIError, bad
from warmpath.protocol.internal import GenerateRequest

# where a default comes from that vLLM on the same model applies too: the operator's override
# (vLLM's own flag of that name) and the model's files (vLLM's ``--generation-config auto``)
VLLM_APPLIES = ("--override-generation-config", "generation_config.json", "GGUF general.sampling.*")
VLLM_OWN = "vLLM's own"


def vllm_defaults(defaults: GenerationDefaults) -> GenerationDefaults:
    """What a vLLM worker gives a request that leaves a sampling field out: ``defaults``'
    values from the operator's override or the model's files (:data:`VLLM_APPLIES`), vLLM's own
    neutral values for the rest (the model table's and warmpath's neutral ones); ``max_tokens``
    as given (the worker's, sent explicitly)."""
    values, sources = {}, dict(defaults.sources)
    for k in SAMPLING_KEYS:
        if defaults.sources.get(k) in VLLM_APPLIES:
            values[k] = getattr(defaults, k)
        else:
            values[k], sources[k] = NEUTRAL[k], VLLM_OWN
    return GenerationDefaults(**values, max_tokens=defaults.max_tokens, sources=sources)


def completion_body(req: GenerateRequest, model: str, aliases: set[str], defaults: GenerationDefaults,
                    max_model_len: int) -> dict:
    """vLLM's ``/v1/completions`` body for ``req``: the fields its client sent, the defaults vLLM
    would apply itself (:func:`vllm_defaults`), ``max_tokens``; :class:`APIError` (400 naming the
    field) for what this worker cannot run."""
    p = req.request
    if p.model is not None and p.model not in aliases:
        raise APIError(400, f"model {p.model!r} does not exist; available: {model!r}",
                       param="model", code="model_not_found")
    if req.first_token is not None:
        raise bad("first_token", "a vLLM worker takes no warmpath (L3) hand-off: its decode side is vLLM's "
                                 "KV connector (kv_transfer_params from a vLLM prefill worker)")
    ids = req.prompt_token_ids
    room = max_model_len - len(ids)
    if room < 1:
        raise bad("prompt_token_ids", f"prompt_token_ids: {len(ids)} tokens leave no room in the "
                                      f"context window ({max_model_len})")
    max_tokens = p.max_new_tokens or max(1, min(defaults.max_tokens, room))
    if max_tokens > room:
        raise bad(p.max_tokens_field, f"{p.max_tokens_field}: {len(ids)} prompt tokens + {max_tokens} "
                                      f"exceed the context window ({max_model_len})")
    body = {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    engine = vllm_defaults(defaults)
    for k in SAMPLING_KEYS:
        v = getattr(p, k)
        if v is None and engine.sources.get(k) != VLLM_OWN:
            v = getattr(engine, k)       # the override's or the model's: vLLM alone applies it too
        if v is not None:
            body[k] = -1 if k == "top_k" and v <= 0 else v     # top_k 0 and -1: off
    if p.stop is not None:
        body["stop"] = list(p.stop_strings())
    if p.stop_token_ids:
        body["stop_token_ids"] = list(p.stop_token_ids)
    if p.ignore_eos:
        body["ignore_eos"] = True
    if p.seed is not None:
        body["seed"] = p.seed
    if p.cache_salt:
        body["cache_salt"] = p.cache_salt
    return body


def upstream_error(status: int, content: bytes) -> APIError:
    """vLLM's error answer as an OpenAI error of the same status (its body is OpenAI-shaped,
    ``{"error": {...}}``, or the older ``{"object": "error", "message": ...}``)."""
    import orjson

    try:
        obj = orjson.loads(content)
    except orjson.JSONDecodeError:
        obj = {}
    err = obj.get("error", obj) if isinstance(obj, dict) else {}
    msg = err.get("message") if isinstance(err, dict) else None
    return APIError(status if 400 <= status < 600 else 502, f"vLLM: {msg or content[:200].decode(errors='replace')}")


@dataclass
class Answer:
    """One request's answer as it streams in from vLLM, rendered in warmpath's shapes, and
    its timings (``timing``: what the router's cost model learns from): the first token's
    seconds from the start, the last one's from the first, the batch it decoded in (set by
    the caller from vLLM's ``/metrics``, ``load.RelayBook``). ``clock``: seconds (tests)."""

    kind: str                      # "chat" | "text"
    model: str
    prompt_tokens: int
    clock: Callable[[], float] = time.monotonic
    start: float | None = None
    rid: str = ""
    texts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    ttft: float | None = None
    last_s: float | None = None    # the last token's time, seconds after the start
    batch: float | None = None     # sequences decoding beside it (itself included), mean
    handed_off: bool = False       # its prompt's KV came through vLLM's KV connector (P/D decode)

    def __post_init__(self) -> None:
        self.rid = self.rid or f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.start = self.clock() if self.start is None else self.start

    def chunk(self, text: str | None, reason: str | None, first: bool = False) -> dict:
        """A streamed chunk (``first``: the chat role chunk)."""
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": int(time.time()), "model": self.model, "choices": [choice]}

    def feed(self, data: dict) -> list[dict]:
        """Take one of vLLM's chunks; returns the chunks to send on (text, then the finish)."""
        out = []
        if isinstance(data.get("usage"), dict) and not data.get("choices"):
            self.usage = self._usage(data["usage"])
            return out
        for c in data.get("choices") or []:
            text, reason = c.get("text") or "", c.get("finish_reason")
            if text or reason:
                self.last_s = self.clock() - self.start
                self.ttft = self.last_s if self.ttft is None else self.ttft
            if text:
                self.texts.append(text)
                out.append(self.chunk(text, None))
            if reason:
                self.finish_reason = reason
                out.append(self.chunk(None, reason))
        return out

    def _usage(self, u: dict) -> dict:
        """vLLM's usage with warmpath's ``usage["warmpath"]["worker"]`` (its prefix cache is L1)."""
        prompt, done = int(u.get("prompt_tokens", self.prompt_tokens)), int(u.get("completion_tokens", 0))
        cached = int(((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": cached},
                "warmpath": {"worker": {"loaded_tokens": {"L1": cached}, "recomputed_tokens": prompt - cached}}}

    def timing(self) -> dict | None:
        """``usage["warmpath"]["timing"]`` (:class:`~warmpath.protocol.internal.AnswerTiming`'s
        fields) once vLLM's usage and the first token came; ``None`` before. The first token's
        time includes vLLM's queue (``queue_s`` is not known per request: 0)."""
        if self.usage is None or self.ttft is None:
            return None
        done = self.usage["completion_tokens"]
        cached = self.usage["prompt_tokens_details"]["cached_tokens"]
        return {"computed_tokens": self.usage["prompt_tokens"] - cached, "cached_tokens": cached,
                "prefill_s": round(self.ttft, 6), "queue_s": 0.0,
                "decode_s": round(max(0.0, (self.last_s or self.ttft) - self.ttft), 6) if done > 1 else 0.0,
                "decode_steps": max(0, done - 1), "batch": round(max(1.0, self.batch or 1.0), 4)}

    def final_usage(self) -> dict:
        """The usage the client gets: vLLM's, with the timings when known."""
        u = self.usage or self._usage({})
        tm = self.timing()
        return u if tm is None else {**u, "warmpath": {**u["warmpath"], "timing": tm}}

    def usage_chunk(self) -> dict:
        return {**self.chunk(None, None), "choices": [], "usage": self.final_usage()}

    def whole(self) -> dict:
        """The non-streamed answer."""
        text, reason = "".join(self.texts), self.finish_reason
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": int(time.time()), "model": self.model,
                "choices": [choice], "usage": self.final_usage()}

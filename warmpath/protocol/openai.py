"""The OpenAI-compatible request models (chat and text completions).

Every field a client may send is typed and range-checked here, before anything reaches the
tokenizer, torch or the scheduler: a value outside its range is a 400 naming the field (the
error handlers of ``protocol.http``), never an exception inside the engine. The models are
strict (``"1"`` is not a number, ``true`` is not an integer); unknown fields are ignored, as
OpenAI-compatible servers do; known fields this engine does not implement are refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping

from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator,
                      model_validator)

INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
ShortStr = Annotated[str, StringConstraints(max_length=512)]
StopStr = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
MAX_STOP = 16
MAX_CHARS_PER_TOKEN = 64   # a prompt longer than this × the context window cannot fit it
MAX_STOP_TOKEN_IDS = 64


MAX_TEMPERATURE = 2.0
MAX_REPETITION_PENALTY = 10.0   # 1.0-1.3 is the useful range; beyond 10 is a mistake
MIN_REPETITION_PENALTY = 1 / MAX_REPETITION_PENALTY   # its mirror (and 5e-324 divides logits into inf)
SAMPLING_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _finite(default: float | None, ge: float | None = None, le: float | None = None, gt: float | None = None):
    return Field(default, ge=ge, le=le, gt=gt, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


def refuse_set(v: Any, info: ValidationInfo) -> Any:
    """A field this engine does not implement may only be absent, zero or false."""
    if v:
        raise ValueError(f"'{info.field_name}' is not supported (only its default)")
    return v


def check_prompt_chars(chars: int, max_model_len: int | None, param: str) -> None:
    """Refuse, before tokenizing, a prompt too long for any tokenization to fit the context."""
    if max_model_len and chars > MAX_CHARS_PER_TOKEN * max_model_len:
        from warmpath.protocol.errors import bad

        raise bad(param, f"the prompt has {chars} characters: more than {MAX_CHARS_PER_TOKEN} per token "
                         f"of the {max_model_len}-token context window, it cannot fit")


class SamplingFields(BaseModel):
    """Fields shared by ``/v1/chat/completions`` and ``/v1/completions`` (and forwarded by
    the router to the workers' ``/internal/*`` routes)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: ShortStr | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    # None (left out, or null): the server's default (``models.generation``: the operator's
    # override, the model's generation config, its card, neutral); see ``sampling_kwargs``.
    temperature: float | None = _finite(None, ge=0, le=MAX_TEMPERATURE)
    top_p: float | None = _finite(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX, description="0 or -1: off")
    min_p: float | None = _finite(None, ge=0, le=1)
    repetition_penalty: float | None = _finite(None, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY)
    seed: Seed | None = None
    stop: StopStr | Annotated[list[StopStr], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] = []
    ignore_eos: bool = False
    presence_penalty: float = _finite(0.0, ge=-2, le=2)
    frequency_penalty: float = _finite(0.0, ge=-2, le=2)
    logprobs: bool | Annotated[int, Field(ge=0, le=20)] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    user: ShortStr | None = None
    cache_salt: ShortStr | None = None
    # smaller is more urgent (vLLM's polarity); the router's admission orders by it (routing/tenants.py,
    # which bounds a client's to +-2**15) and passes workers 2 x it (+1 for a backlogged tenant)
    priority: int | None = Field(None, ge=-(2 ** 31), le=2 ** 31 - 1)

    @field_validator("presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", mode="after")
    @classmethod
    def _unsupported(cls, v: Any, info: ValidationInfo) -> Any:
        return refuse_set(v, info)

    @property
    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens`` if given, else ``max_tokens`` (``None``: server default)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling_kwargs(self, defaults: Mapping[str, float | int]) -> dict[str, Any]:
        """The keyword arguments of ``SamplingParams`` (all but ``max_tokens``): each of
        :data:`SAMPLING_DEFAULTED` is the request's own value, else ``defaults[name]``."""
        own = {k: getattr(self, k) for k in SAMPLING_DEFAULTED}
        picked = {k: defaults[k] if v is None else v for k, v in own.items()}
        picked["top_k"] = max(0, picked["top_k"])   # -1 and 0: off
        return dict(**picked, seed=self.seed, stop=self.stop_strings(),
                    stop_token_ids=tuple(self.stop_token_ids), ignore_eos=self.ignore_eos)

    def forwarded(self) -> dict[str, Any]:
        """The sampling fields as JSON for a worker (the prompt travels as token ids)."""
        return SamplingFields.model_validate(self.model_dump(exclude_unset=True)).model_dump(
            exclude_unset=True, mode="json")


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: ShortStr | None = None

    @model_validator(mode="after")
    def _content(self) -> "Message":
        if self.content is None and self.role != "assistant":
            raise ValueError(f"'content' is required for role {self.role!r}")
        return self

    def flat(self) -> dict[str, str]:
        """``{"role", "content"}`` with text parts joined; ``developer`` is a system message."""
        c = self.content
        text = "" if c is None else c if isinstance(c, str) else "".join(p.text for p in c)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], Field(min_length=1)]

    def flat_messages(self) -> list[dict[str, str]]:
        return [m.flat() for m in self.messages]

    def prompt_chars(self) -> int:
        return sum(len(m["content"]) for m in self.flat_messages())


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: one prompt, as text or token ids (no batches)."""

    prompt: (Annotated[str, StringConstraints(min_length=1)]
             | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(min_length=1, max_length=1)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)])
    echo: bool = False
    suffix: str | None = None

    def prompt_chars(self) -> int:
        return len(self.prompt) if isinstance(self.prompt, str) else 0

    @field_validator("prompt", mode="after")
    @classmethod
    def _one_prompt(cls, p: Any) -> str | list[int]:
        if isinstance(p, list) and isinstance(p[0], (str, list)):
            return p[0]
        return p

    @field_validator("echo", "suffix", mode="after")
    @classmethod
    def _no_echo(cls, v: Any, info: ValidationInfo) -> Any:
        return refuse_set(v, info)

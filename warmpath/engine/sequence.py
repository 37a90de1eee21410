"""Requests as the scheduler sees them: sampling parameters and sequence state.

NOTE: no torch here (the simulator reuses it).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from warmpath.kv.hashing import BlockHash, KVNamespace, digest_prefix_blocks, hash_prefix_blocks
from warmpath.models.generation import MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings, validated on construction.

    ``temperature == 0`` means greedy. ``seed`` makes sampling reproducible per
    request regardless of batching. ``max_tokens`` is the cap on generated tokens.
    ``min_p`` (0 = off) drops tokens less likely than ``min_p`` × the likeliest one;
    ``repetition_penalty`` (1 = off) divides the positive logits, and multiplies the
    negative ones, of every token already in the prompt or the output (HF / vLLM
    semantics; it applies to greedy requests too).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0           # 0 = disabled
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    priority: int = 0        # smaller is more urgent: scheduled first, preempted last (vLLM's polarity)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not self.temperature >= 0:   # NaN fails too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed must be a 64-bit signed integer, got {self.seed}")
        if not 0 < self.top_p <= 1:   # NaN fails too
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:   # NaN fails too
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:   # NaN fails too
            raise ValueError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] "
                             f"(a tiny one divides logits into inf), got {self.repetition_penalty}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or so close to it (< 1e-5, as vLLM) that dividing float32 logits
        by it would overflow: the argmax either way."""
        return self.temperature < 1e-5

    @property
    def penalizes(self) -> bool:
        """Whether sampling needs the sequence's tokens (a repetition penalty applies)."""
        return self.repetition_penalty != 1.0


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"    # admitted; its cached prefix is loading beside the steps
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request's tokens, KV blocks and progress.

    ``num_computed_tokens`` tokens of ``token_ids`` have KV in the cache; the
    next step computes from there. The last sampled token is never computed
    until the following step.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    namespace: KVNamespace
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1        # prefix-cache hit at first schedule (-1: not yet)
    # where those cached tokens came from (L1 reused, L2/L3 loaded; a failed load is taken back)
    cached_by_tier: dict[str, int] = field(default_factory=lambda: {"L1": 0, "L2": 0, "L3": 0})
    l3_written_blocks: int = 0         # blocks of this sequence this worker wrote to L3 (store said 0)
    l3_load_s: float = 0.0             # seconds its loads from L3 took on this worker (measured)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    block_digests: list[bytes] = field(default_factory=list)   # only when a tier asks (full_block_digests)
    num_sealed_blocks: int = 0         # leading blocks registered in the prefix cache
    finish_reason: str | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt must have at least one token")

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by generated tokens."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def in_prefill(self) -> bool:
        """Still computing tokens it already knows (prompt, or recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

    def full_block_hashes(self) -> list[BlockHash]:
        """Hash chain of all full blocks of ``token_ids`` (incremental, memoised)."""
        if len(self.block_hashes) < self.num_tokens // self.namespace.block_size:
            self.block_hashes = hash_prefix_blocks(self.namespace, self.token_ids,
                                                   self.block_hashes)
        return self.block_hashes

    def full_block_digests(self) -> list[bytes]:
        """BLAKE2b prefix digests of all full blocks (incremental, memoised; see
        :func:`~warmpath.kv.hashing.digest_prefix_blocks`)."""
        if len(self.block_digests) < self.num_tokens // self.namespace.block_size:
            self.block_digests = digest_prefix_blocks(self.namespace, self.token_ids,
                                                      self.block_digests)
        return self.block_digests

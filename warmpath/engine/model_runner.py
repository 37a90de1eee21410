"""Runs one scheduled step on the model: builds tensors, runs forward, samples."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from warmpath.engine.sampler import Sampler
from warmpath.engine.scheduler import ScheduledSeq, SchedulerOutput
from warmpath.kv.host_pool import lazy_zeros
from warmpath.models.attention import ATTENTION_IMPLS, AttentionMetadata
from warmpath.models.loader import LoadedModel


@dataclass
class StepResult:
    """Sampled tokens per request id; ``logits`` rows follow ``sampled_ids`` when asked;
    ``failed``: requests whose sampling raised (their token in ``sampled`` is a stand-in)."""

    sampled: dict[str, int]
    sampled_ids: list[str]
    logits: torch.Tensor | None = None
    failed: dict[str, str] = field(default_factory=dict)


SMALL_DECODE = 4     # a decode-only step of fewer sequences runs on ``decode_threads``


def decode_threads_default(threads: int, device: torch.device) -> int:
    """Torch threads for a small decode-only step (fewer than ``SMALL_DECODE`` sequences): on
    CPU one fewer than the worker's, at least 1. Such a step is a few milliseconds of small
    operators; with every core in the OpenMP team, the worker's HTTP, streaming and tokenizer
    threads (and the router, on a shared machine) preempt a team member at each token and the
    team waits at its barriers. Measured through HTTP on 2 cores (``benchmarks/peers/vs_llamacpp.py``,
    docs/benchmarks/engine.md): batch-1 TPOT 28.3 ms with 2 threads, 22.1–25.4 ms with small
    decodes on 1 (19.4–21.3 ms with the whole worker on 1), while 16 streams decoded faster on 2
    in the best run (337 vs 250–309 tok/s; runs of one setting spread 195–338). Larger decode steps and every
    step with a prefill chunk keep all threads."""
    return max(1, threads - 1) if device.type == "cpu" else threads


class ModelRunner:
    """Owns the model and the L1 KV tensors of one worker.

    KV layout: ``[layers, 2 (k|v), num_blocks, block_size, kv_heads, head_dim]``.
    ``attention``: ``paged`` (K/V read in place) or ``gather`` (the former copy, for
    debugging); ``compile`` ``on``: decode-only steps run the compiled step
    (``models/compiled_step.py``), compiled here for batches up to ``max_batch``.
    ``decode_threads``: torch threads of small decode-only steps (None: ``decode_threads_default``).
    ``kv_dtype``: the KV tensors' dtype (None: the model's); a float16 cache under a float32
    model halves KV bytes (attention computes in float32, rows rounded when written).
    """

    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int,
                 attention: str = "paged", compile: str = "off", max_batch: int = 64,
                 decode_threads: int | None = None, kv_dtype: torch.dtype | None = None) -> None:
        if attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {attention!r}")
        self.model = loaded.model
        self.cfg = loaded.config
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.kv_dtype = kv_dtype or p.dtype
        self.block_size = block_size
        self.threads = torch.get_num_threads()
        if decode_threads is not None and decode_threads <= 0:
            raise ValueError(f"decode_threads must be > 0, got {decode_threads}")
        self.decode_threads = decode_threads or decode_threads_default(self.threads, self.device)
        self.num_blocks = num_blocks
        # NOTE: on CPU the pages are committed as blocks are first written (lazy_zeros).
        self.kv_caches = lazy_zeros(
            (self.cfg.num_layers, 2, num_blocks, block_size, self.cfg.num_kv_heads, self.cfg.head_dim),
            self.kv_dtype, self.device)
        self.sampler = Sampler(self.device)
        self.attention = attention
        self.compiled = None
        if compile == "on":
            from warmpath.models.compiled_step import CompiledDecode
            self.compiled = CompiledDecode(self.model, self.device)
            self.compiled.warmup(self.kv_caches, block_size, max_batch)
        elif compile != "off":
            raise ValueError(f"compile must be 'on' or 'off', got {compile!r}")

    @property
    def compile_seconds(self) -> float:
        """Wall time the compiled step's warm-up took at start (0 when not compiled)."""
        return self.compiled.compile_seconds if self.compiled else 0.0

    def _slots(self, s: ScheduledSeq) -> list[int]:
        bs, table = self.block_size, s.seq.block_ids
        start = s.seq.num_computed_tokens
        return [table[p // bs] * bs + p % bs for p in range(start, start + s.num_tokens)]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, return_logits: bool = False) -> StepResult:
        """Compute the step and sample for every chunk that reaches its sequence's end."""
        decodes = [s for s in out.scheduled if s.num_tokens == 1]
        prefills = [s for s in out.scheduled if s.num_tokens > 1]
        ordered = decodes + prefills
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        for s in ordered:
            start = s.seq.num_computed_tokens
            ids.extend(s.seq.token_ids[start:start + s.num_tokens])
            pos.extend(range(start, start + s.num_tokens))
            slots.extend(self._slots(s))
        bs = self.block_size

        def table(s: ScheduledSeq) -> list[int]:
            return s.seq.block_ids[:-(-(s.seq.num_computed_tokens + s.num_tokens) // bs)]

        meta = AttentionMetadata.build(
            bs, [table(s) for s in decodes], [s.seq.num_computed_tokens + 1 for s in decodes],
            [(s.num_tokens, s.seq.num_computed_tokens + s.num_tokens, table(s)) for s in prefills],
            slots, self.device, impl=self.attention)
        step = self.compiled.forward if self.compiled and not prefills else self.model
        threads = self.threads if prefills or len(decodes) >= SMALL_DECODE else self.decode_threads
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        hidden = step(torch.tensor(ids, dtype=torch.long, device=self.device),
                      torch.tensor(pos, dtype=torch.long, device=self.device), self.kv_caches, meta)
        rows, sample_seqs, offset = [], [], 0
        for s in ordered:
            offset += s.num_tokens
            if s.samples:
                rows.append(offset - 1)
                sample_seqs.append(s.seq)
        if not rows:
            return StepResult({}, [])
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
        req_ids = [q.request_id for q in sample_seqs]
        history = [(q.prompt_token_ids, q.output_token_ids) if q.params.penalizes else None for q in sample_seqs]
        toks, failed = self.sampler.sample(logits, req_ids, [q.params for q in sample_seqs], history)
        return StepResult(dict(zip(req_ids, toks)), req_ids, logits if return_logits else None, failed)

"""What the engine reports for a request after each step (no torch).

:class:`RequestOutput` is one request's news from one step; :class:`OutputAssembler` keeps
each unfinished request's incremental detokenizer (stop strings held back until they cannot
match) and builds its outputs: the tokens handed off with it (a prefill worker's first token),
each new token, or its failure. The engine decides *when* a request ends (the scheduler's stop
rules, a fault of its own); this module says *what* the request is told.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.engine.detokenizer import Decoder, IncrementalDetokenizer
from warmpath.engine.sequence import SamplingParams, Sequence


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_time: float | None = None  # arrival → first scheduled (set with the first token)
    error: str | None = None         # the request failed inside a step (it alone; finished)
    # cached_tokens by origin: {"L1": reused, "L2": loaded, "L3": loaded} (None: not scheduled)
    cached_by_tier: dict[str, int] | None = None
    l3_written_blocks: int = 0       # blocks of this request this worker wrote to L3 so far
    l3_prompt_blocks: int | None = None   # full prompt blocks known in L3 (with the first token)
    l3_load_s: float = 0.0           # seconds its loads from L3 took here so far (measured)


class OutputAssembler:
    """Per unfinished request: its detokenizer; per step: the :class:`RequestOutput` it gets."""

    def __init__(self, tokenizer: Decoder | None, eos_ids: tuple[int, ...]) -> None:
        self.tokenizer, self.eos_ids = tokenizer, eos_ids
        self._detok: dict[str, IncrementalDetokenizer] = {}

    def open(self, request_id: str, stop: tuple[str, ...]) -> None:
        """Start the text of a new request (``stop``: its stop strings)."""
        self._detok[request_id] = IncrementalDetokenizer(self.tokenizer, stop)

    def close(self, request_id: str) -> None:
        """Forget a request that ended (no-op when unknown)."""
        self._detok.pop(request_id, None)

    def prefix(self, seq: Sequence, reason: str | None) -> RequestOutput:
        """The output of the tokens handed off with ``seq`` (all of ``seq.output_token_ids``);
        ``reason``: the scheduler's stop verdict on the last of them, else ``"stop"`` when a
        stop string appears. A request this ends is closed."""
        det = self._detok[seq.request_id]
        text = det.update(seq.output_token_ids, final=reason is not None)
        if det.stopped and reason is None:
            reason = "stop"
        if reason is not None:
            self.close(seq.request_id)
        return RequestOutput(seq.request_id, list(seq.output_token_ids), text, reason is not None,
                             reason, seq.num_prompt_tokens, 0, len(seq.output_token_ids), 0.0)

    def early_prefix(self, request_id: str, num_prompt_tokens: int, params: SamplingParams,
                     prefix: list[int] | None) -> RequestOutput | None:
        """What :meth:`prefix` will say for ``prefix``, computed from nothing but the arguments
        (safe from another thread), when the prefix surely does not end the request (no stop
        strings, no stop/EOS token, ``max_tokens`` > its length); ``None`` otherwise."""
        if not prefix or params.stop or len(prefix) >= params.max_tokens:
            return None
        if any(t in params.stop_token_ids or (t in self.eos_ids and not params.ignore_eos) for t in prefix):
            return None
        text = IncrementalDetokenizer(self.tokenizer, ()).update(list(prefix))
        return RequestOutput(request_id, list(prefix), text, False, None, num_prompt_tokens, 0, len(prefix), 0.0)

    def token_text(self, seq: Sequence, done: bool) -> tuple[str, bool]:
        """The text ``seq``'s newest token lets out, and whether a stop string ended it."""
        det = self._detok[seq.request_id]
        return det.update(seq.output_token_ids, final=done), det.stopped

    @staticmethod
    def token(seq: Sequence, text: str, done: bool, l3_prompt_blocks: int | None) -> RequestOutput:
        """The output of ``seq``'s newest token (with the first one: its queue time and the
        prompt blocks known in L3)."""
        first = len(seq.output_token_ids) == 1
        return RequestOutput(
            seq.request_id, [seq.output_token_ids[-1]], text, done, seq.finish_reason,
            seq.num_prompt_tokens, max(0, seq.num_cached_tokens), len(seq.output_token_ids),
            (seq.first_scheduled_time or seq.arrival_time) - seq.arrival_time if first else None,
            cached_by_tier=dict(seq.cached_by_tier), l3_written_blocks=seq.l3_written_blocks,
            l3_prompt_blocks=l3_prompt_blocks if first else None, l3_load_s=seq.l3_load_s)

    @staticmethod
    def failed(seq: Sequence, error: str) -> RequestOutput:
        """The last output of a request that failed inside a step (nothing new, its error)."""
        return RequestOutput(seq.request_id, [], "", True, "error", seq.num_prompt_tokens,
                             max(0, seq.num_cached_tokens), len(seq.output_token_ids), error=error,
                             cached_by_tier=dict(seq.cached_by_tier), l3_written_blocks=seq.l3_written_blocks,
                             l3_load_s=seq.l3_load_s)

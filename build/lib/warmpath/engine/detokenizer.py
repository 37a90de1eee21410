"""Incremental detokenization with stop strings (held back until they cannot match)."""

from __future__ import annotations

from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of output tokens into text deltas.

    Text that might be the start of a stop string, or an incomplete UTF-8
    sequence, is held back. When a stop string appears the text is cut before
    it and :attr:`stopped` becomes true.
    """

    def __init__(self, tokenizer: Decoder | None, stop: tuple[str, ...]) -> None:
        self.tok = tokenizer
        self.stop = stop
        self.text = ""          # all text so far (after a stop: cut before the stop string)
        self.sent = 0           # chars of ``text`` already emitted
        self.stopped = False

    def update(self, output_ids: list[int], final: bool = False) -> str:
        """Feed all output tokens so far; return the text that can be emitted now."""
        if self.tok is None or self.stopped:
            return ""
        text = self.tok.decode(output_ids)
        if text.endswith("\ufffd") and not final:
            return ""  # incomplete multi-byte character
        self.text = text
        hold = 0
        if self.stop:
            search_from = max(0, self.sent - max(len(s) for s in self.stop))
            hits = [i for i in (text.find(s, search_from) for s in self.stop) if i >= 0]
            if hits:
                self.text = text[:min(hits)]
                self.stopped = True
                final = True
            elif not final:
                hold = self._partial_stop_len(text)
        end = len(self.text) - hold
        delta = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return delta

    def _partial_stop_len(self, text: str) -> int:
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    best = max(best, k)
                    break
        return best

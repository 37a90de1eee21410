"""The lower KV tiers' decisions, shared by the engine and the simulator (pure, no torch).

:class:`ExternalPrefixSource` is the scheduler's seam to the tiers below L1.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from warmpath.engine.sequence import Sequence


class ExternalPrefixSource(ABC):
    """Prefix blocks the scheduler can get from below L1 (host DRAM, the distributed store)."""

    @abstractmethod
    def lookup(self, seq: Sequence, num_local_blocks: int) -> int:
        """Blocks right after the ``num_local_blocks`` L1 hits worth loading (0 = recompute)."""

    @abstractmethod
    def schedule_load(self, seq: Sequence, first_block: int, num_blocks: int) -> None:
        """``seq.block_ids[first_block:first_block+num_blocks]`` are allocated; fill them
        before the next forward (or roll ``seq.num_computed_tokens`` back on failure)."""

    @abstractmethod
    def cancel(self, seq: Sequence) -> None:
        """Forget a plan from :meth:`lookup` that the scheduler could not allocate for."""


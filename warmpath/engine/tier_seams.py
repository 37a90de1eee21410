"""The seams of the lower KV tiers (pure, no torch): the scheduler's view of them
(:class:`ExternalPrefixSource`), the byte mover under the rules (:class:`TierMover`) and
what the rules did (:class:`TierStats`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from warmpath.engine.sequence import Sequence
from warmpath.kv.block_pool import KVBlock


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

    def defers(self, seq: Sequence) -> bool:
        """Whether the load :meth:`lookup` planned for ``seq`` runs beside the steps (the
        scheduler then keeps ``seq`` out of every batch until :meth:`landed` returns it)."""
        return False

    def landed(self) -> list[Sequence]:
        """Sequences whose deferred loads finished since the last call (their computed
        counts already rolled back where a block failed), finished ones included."""
        return []


@dataclass
class TierStats:
    """What the rules did (counts of blocks unless named tokens)."""

    l1_evictions: int = 0
    l2_hits: int = 0          # blocks loaded from L2
    l2_evictions: int = 0
    l3_loaded: int = 0
    load_failures: int = 0    # planned blocks that had to be recomputed
    l3_removed: int = 0       # announced L3 blocks later found gone (withdrawn)
    # (tier, reason) -> loaded blocks refused by their checks (kv/block_codec.py REASONS)
    verify_failures: dict[tuple[str, str], int] = field(default_factory=dict)
    loaded_tokens: dict[str, int] = field(default_factory=lambda: {"L2": 0, "L3": 0})


@dataclass
class LoadResult:
    """Blocks a mover delivered (leading runs) and the seconds it measured (``None``: not
    measured, e.g. modelled by the simulator, which must not re-learn its own model);
    ``rejected``: ``(tier, hash, reason)`` of a block found but refused by its checks
    (``kv/block_codec.py``), where the run stopped."""

    l2: int
    l3: int
    l2_s: float | None = None
    l3_s: float | None = None
    rejected: list[tuple[str, bytes, str]] = field(default_factory=list)


class TierMover(ABC):
    """Moves KV bytes between tiers; :class:`TierRules` decides what moves."""

    block_bytes: int

    @property
    @abstractmethod
    def l2_capacity(self) -> int:
        """L2 blocks (0: no L2)."""

    @property
    @abstractmethod
    def has_l3(self) -> bool:
        """Whether an L3 store is configured."""

    @abstractmethod
    def count_l2(self, hashes: list[bytes]) -> int:
        """Leading ``hashes`` L2 holds."""

    @abstractmethod
    def count_l3(self, hashes: list[bytes]) -> int:
        """Leading ``hashes`` the store holds."""

    @abstractmethod
    def in_l2(self, h: bytes) -> bool:
        """Whether L2 holds ``h``."""

    @abstractmethod
    def l2_victim(self) -> bytes | None:
        """The hash the next demotion would evict from L2 (``None``: there is room)."""

    @abstractmethod
    def demote(self, blk: KVBlock) -> bytes | None:
        """Copy an L1 block into L2; returns the hash evicted to make room."""

    @abstractmethod
    def put_l3(self, blocks: list[KVBlock]) -> tuple[list[bytes], list[bytes]] | None:
        """Write L1 blocks to the store; returns ``(written, present)``: the hashes it
        stored now and those it already held. Anything else (store full, down) is in neither.
        ``None``: a load beside the steps holds the store's transfer path; ask again later."""

    @abstractmethod
    def spill_l3(self, h: bytes) -> tuple[list[bytes], list[bytes]]:
        """Write L2's copy of ``h`` to the store; ``(written, present)`` as :meth:`put_l3`."""

    @abstractmethod
    def load(self, seq: Sequence, first_block: int, n_l2: int, n_l3: int) -> LoadResult:
        """Fill ``seq.block_ids[first_block:]``: ``n_l2`` blocks from L2, then (if all of
        those arrived) ``n_l3`` from the store; stops at the first missing block."""

    @property
    def overlaps_loads(self) -> bool:
        """Whether :meth:`start_load` runs beside the steps (else it loads at once)."""
        return False

    def start_load(self, seq: Sequence, first_block: int, n_l2: int, n_l3: int) -> object:
        """Begin :meth:`load`; returns a handle for :meth:`poll_load`. This default loads at once."""
        return self.load(seq, first_block, n_l2, n_l3)

    def poll_load(self, handle: object) -> LoadResult | None:
        """The result of a started load, or ``None`` while it runs."""
        assert isinstance(handle, LoadResult)
        return handle

    def wait_loads(self, handles: list, timeout_s: float) -> None:
        """Block until one of ``handles`` may have finished, ``timeout_s`` at most."""

    @abstractmethod
    def take_l3_removed(self) -> list[bytes]:
        """Hashes found gone from the store since the last call (drained)."""

    def exists_l3(self, hashes: list[bytes]) -> list[bool] | None:
        """Whether the store holds each hash (``None``: unknown; movers whose store reports
        its evictions through :meth:`take_l3_removed` need not answer)."""
        return None

"""The KV hierarchy of one worker: L1 device pool → L2 host DRAM → L3 Mooncake Store.

:class:`TieredKV` is the real byte mover (torch tensors, :class:`HostKVPool`,
:class:`MooncakeL3`) under :class:`~warmpath.engine.tier_rules.TierRules`, which decides
what moves (demotion, write-through / write-back, load vs recompute, KV events).

Blocks this worker announced as in L3 are re-checked with Mooncake's ``batch_is_exist``
(``l3_check_blocks`` per ``l3_check_interval_s``, in the engine's idle time or after a
step, on the engine thread); those the store evicted, and any a get finds missing, are
withdrawn with ``BlockRemoved(medium="L3")``.

Every block loaded from L2 or L3 is checked to be the one the request wants (its key,
tokens, parent and prefix digest; an L3 block's bytes too, an L2 block's with
``l2_checksum``: ``kv/block_codec.py``); one that is not is a miss, recomputed with
everything after it, counted per tier and reason, and not used again.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from warmpath.engine.sequence import Sequence
from warmpath.engine.tier_rules import WRITE_MODES, TierRules, TierStats
from warmpath.engine.tier_seams import LoadResult, TierMover
from warmpath.kv.block_codec import BlockIdentity, derive_key
from warmpath.kv.block_pool import BlockPool, KVBlock
from warmpath.kv.events import KVEventPublisher
from warmpath.kv.hashing import NO_PARENT, pack_tokens
from warmpath.kv.host_pool import HostKVPool
from warmpath.kv.load_cost import LoadCostModel
from warmpath.kv.mooncake_store import MooncakeConfig, MooncakeL3


@dataclass(frozen=True)
class TierConfig:
    """Lower tiers of one worker. ``l3=None`` disables the store; ``l2_gib=0`` disables L2;
    ``l2_gib=None``: L2 holds as many blocks as L1 (``kv/sizing.py``)."""

    l2_gib: float | None = None
    l3: MooncakeConfig | None = None
    write_mode: str = "write-back"       # write-through | write-back | none
    load_mode: str = "auto"              # auto | always | never
    events: bool = True
    events_host: str = "127.0.0.1"
    events_port: int = 0                 # 0 = a free port
    events_advertise_host: str | None = None   # the address announced to the router (default: events_host)
    events_token: str | None = field(default=None, repr=False)   # subscribers must present it (ZeroMQ PLAIN)
    l3_check_interval_s: float = 2.0     # re-check announced L3 blocks this often (0 = never)
    l3_check_blocks: int = 64            # ... this many per check (each check leases them ~5 s)
    l3_record_blocks: int = 1 << 16      # announced L3 hashes remembered (LRU)
    kv_secret: str | None = field(default=None, repr=False)   # keys L3 block headers (the cluster token)
    l2_checksum: bool = False            # also checksum L2 blocks' bytes (~halves L2 load speed: docs/kv_verify.md)
    l3_overlap: bool = False             # L3 loads run beside the steps (tier_rules.py: overlapped loads)

    def __post_init__(self) -> None:
        if self.l2_gib is not None and self.l2_gib < 0:
            raise ValueError(f"l2_gib must be >= 0, got {self.l2_gib}")
        if self.write_mode not in WRITE_MODES:
            raise ValueError(f"write_mode must be write-through, write-back or none, "
                             f"got {self.write_mode!r}")


class TieredKV(TierMover):
    """Owns L2/L3 for one engine; :attr:`rules` is the scheduler's external prefix source."""

    def __init__(self, cfg: TierConfig, kv_caches: torch.Tensor, pool: BlockPool, block_size: int,
                 worker_id: str = "worker") -> None:
        self.cfg, self.kv, self.bs = cfg, kv_caches, block_size
        # One block across layers: kv[:, :, block_id] -> [layers, 2, bs, kvh, hd]
        self.block_shape = tuple(kv_caches[:, :, 0].shape)
        self.dtype_name = str(kv_caches.dtype).removeprefix("torch.")
        cap = pool.num_blocks if cfg.l2_gib is None else HostKVPool.capacity_for(
            cfg.l2_gib, self.block_shape, kv_caches.dtype)
        self.l2 = HostKVPool(cap, self.block_shape, kv_caches.dtype, pin=kv_caches.is_cuda,
                             checksum=cfg.l2_checksum)
        self.block_bytes = kv_caches[:, :, 0].numel() * kv_caches.element_size()
        self.l3 = MooncakeL3(cfg.l3, self.block_bytes, self.dtype_name, self.block_shape,
                             tag_key=derive_key(cfg.kv_secret)) if cfg.l3 else None
        pool.keep_identity = True   # sealed blocks carry what their copies below L1 are checked against
        self.events = KVEventPublisher(worker_id, cfg.events_host, cfg.events_port,
                                       advertise_host=cfg.events_advertise_host,
                                       token=cfg.events_token) if cfg.events else None
        self.rules = TierRules(self, pool, block_size, cfg.write_mode, LoadCostModel(cfg.load_mode),
                               self.events.publish if self.events else None, l3_record=cfg.l3_record_blocks)
        self._next_check = 0.0
        self._loader = cf.ThreadPoolExecutor(1, thread_name_prefix="kv-load") if cfg.l3_overlap else None

    @property
    def stats(self) -> TierStats:
        return self.rules.stats

    @property
    def cost(self) -> LoadCostModel:
        return self.rules.cost

    # -- engine hooks --------------------------------------------------------
    def apply_loads(self) -> None:
        """Fill the blocks planned this step (see :meth:`TierRules.apply_loads`)."""
        self.rules.apply_loads()

    def after_step(self) -> list[bytes]:
        """Write-through, due L3 checks, this step's events; returns the hashes written."""
        self._maybe_check_l3()
        return self.rules.flush()

    def idle(self) -> None:
        """The engine has nothing to do: check L3 if due and publish what that found."""
        if self._maybe_check_l3():
            self.rules.flush()

    def _maybe_check_l3(self) -> bool:
        now = time.monotonic()
        if self.l3 is None or not self.cfg.l3_check_interval_s or now < self._next_check:
            return False
        self._next_check = now + self.cfg.l3_check_interval_s
        return self.rules.check_l3(self.cfg.l3_check_blocks) > 0

    def close(self) -> None:
        if self._loader is not None:
            self._loader.shutdown(wait=True, cancel_futures=True)   # NOTE: a load writes into the cache
        if self.events is not None:
            self.events.close()
        if self.l3 is not None:
            self.l3.close()

    # -- TierMover -----------------------------------------------------------
    @property
    def l2_capacity(self) -> int:
        return self.l2.index.capacity

    @property
    def has_l3(self) -> bool:
        return self.l3 is not None

    def count_l2(self, hashes: list[bytes]) -> int:
        return self.l2.count_prefix(hashes)

    def count_l3(self, hashes: list[bytes]) -> int:
        return self.l3.count_prefix(hashes)

    def in_l2(self, h: bytes) -> bool:
        return h in self.l2

    def l2_victim(self) -> bytes | None:
        v = self.l2.peek_victim()
        return None if v is None else v[0].block_hash

    def demote(self, blk: KVBlock) -> bytes | None:
        return self.l2.put(_identity(blk), self.kv[:, :, blk.block_id])

    def put_l3(self, blocks: list[KVBlock]) -> tuple[list[bytes], list[bytes]] | None:
        return self.l3.put([_identity(b) for b in blocks],
                           lambda j, payload: self._block_view(payload).copy_(self.kv[:, :, blocks[j].block_id]),
                           wait=self._loader is None)

    def spill_l3(self, h: bytes) -> tuple[list[bytes], list[bytes]]:
        """NOTE: while an overlapped load holds the store's path the victim is not spilled
        (it leaves L2 uncopied, a future recompute; counted in ``l3.stats.busy_skips``)."""
        ident, src = self.l2.peek_victim()
        assert ident.block_hash == h, "only L2's next victim is spilled"
        got = self.l3.put([ident], lambda j, payload: self._block_view(payload).copy_(src),
                          wait=self._loader is None)
        return got if got is not None else ([], [])

    # -- overlapped loads ------------------------------------------------------
    @property
    def overlaps_loads(self) -> bool:
        return self._loader is not None

    def start_load(self, seq: Sequence, first_block: int, n_l2: int, n_l3: int) -> tuple:
        """The L2 run now, the L3 run on the loader thread (handle: both parts)."""
        ok2, l2_s, rejected = self._load_l2(seq, first_block, n_l2)
        if ok2 < n_l2:   # a missing L2 block ends the run: no L3 load
            fut: cf.Future = cf.Future()
            fut.set_result((0, None, []))
        else:
            fut = self._loader.submit(self._load_l3, seq, first_block + ok2, n_l3)
        return ok2, l2_s, rejected, fut

    def poll_load(self, handle: tuple) -> LoadResult | None:
        ok2, l2_s, rejected, fut = handle
        if not fut.done():
            return None
        ok3, l3_s, refused = fut.result()
        return LoadResult(ok2, ok3, l2_s, l3_s, rejected + refused)

    def wait_loads(self, handles: list, timeout_s: float) -> None:
        cf.wait([h[3] for h in handles], timeout=timeout_s, return_when=cf.FIRST_COMPLETED)

    def load(self, seq: Sequence, first_block: int, n_l2: int, n_l3: int) -> LoadResult:
        ok2, l2_s, rejected = self._load_l2(seq, first_block, n_l2)
        if ok2 < n_l2 or not n_l3:
            return LoadResult(ok2, 0, l2_s, rejected=rejected)
        ok3, l3_s, refused = self._load_l3(seq, first_block + ok2, n_l3)
        return LoadResult(ok2, ok3, l2_s, l3_s, rejected + refused)

    def take_l3_removed(self) -> list[bytes]:
        return self.l3.take_not_found() if self.l3 is not None and self.l3.not_found else []

    def exists_l3(self, hashes: list[bytes]) -> list[bool] | None:
        return self.l3.exists(hashes) if self.l3 is not None else None

    def _load_l2(self, seq: Sequence, first_block: int, n: int) -> tuple[int, float, list]:
        """The leading L2 run (on the engine thread: L2 changes under every step's evictions)."""
        ok, rejected, t0 = 0, [], time.perf_counter()
        for w in self._wants(seq, first_block, first_block + n):
            src, reason = self.l2.get(w)
            if src is None:
                if reason is not None:
                    rejected.append(("L2", w.block_hash, reason))
                break
            self.kv[:, :, seq.block_ids[first_block + ok]].copy_(src, non_blocking=True)
            ok += 1
        return ok, time.perf_counter() - t0, rejected

    def _load_l3(self, seq: Sequence, start: int, n: int) -> tuple[int, float, list]:
        """The L3 run from block ``start`` (on the engine thread, or the loader's beside it)."""
        t0 = time.perf_counter()
        ok = self.l3.get(self._wants(seq, start, start + n),
                         lambda j, payload: self._from_bytes(seq.block_ids[start + j], payload))
        refused = [("L3", h, reason) for h, reason in self.l3.rejected]
        self.l3.rejected = []
        return ok, time.perf_counter() - t0, refused

    # -- internals -----------------------------------------------------------
    def _wants(self, seq: Sequence, lo: int, hi: int) -> list[BlockIdentity]:
        """What blocks ``lo..hi-1`` of ``seq`` must be, for the checks of a load."""
        hashes, digests, step = seq.full_block_hashes(), seq.full_block_digests(), 4 * self.bs
        packed = pack_tokens(seq.token_ids[lo * self.bs:hi * self.bs])
        return [BlockIdentity(hashes[i], hashes[i - 1] if i else NO_PARENT, digests[i],
                              packed[(i - lo) * step:(i - lo + 1) * step]) for i in range(lo, hi)]

    def _block_view(self, payload: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(payload).view(self.kv.dtype).view(self.block_shape)

    def _from_bytes(self, block_id: int, payload: np.ndarray) -> None:
        self.kv[:, :, block_id].copy_(self._block_view(payload))


def _identity(blk: KVBlock) -> BlockIdentity:
    assert blk.prefix_digest is not None, "a sealed block of a pool that keeps identities"
    return BlockIdentity.of(blk.block_hash, blk.parent_hash, blk.prefix_digest, blk.token_ids)

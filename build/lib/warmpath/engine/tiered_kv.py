"""The KV hierarchy of one worker: L1 device pool → L2 host DRAM → L3 Mooncake Store.

* L1 eviction demotes the block to L2 (LRU); an L2 hit is copied back into L1 blocks.
* Write policy ``write-through``: every sealed L1 block is written to L3 right after the
  step that computed it. ``write-back``: a block goes to L3 when L2 evicts it.
* Prefix lookup below L1 goes L2 first, then L3; each part is loaded only when the cost
  model says loading beats recomputing. A block that fails to load (missing, corrupt,
  L3 down) and everything after it is recomputed instead.
* Every change is published as a KV event (tier = ``medium``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from warmpath.engine.sequence import Sequence
from warmpath.kv.block_pool import BlockPool, KVBlock
from warmpath.kv.events import BlockRemoved, BlockStored, KVEventPublisher
from warmpath.kv.host_pool import HostKVPool
from warmpath.kv.mooncake_store import MooncakeConfig, MooncakeL3
from warmpath.engine.tier_rules import ExternalPrefixSource
from warmpath.kv.load_cost import LoadCostModel


@dataclass(frozen=True)
class TierConfig:
    """Lower tiers of one worker. ``l3=None`` disables the store; ``l2_gib=0`` disables L2."""

    l2_gib: float = 1.0
    l3: MooncakeConfig | None = None
    write_policy: str = "write-back"     # write-through | write-back | none
    load_policy: str = "auto"            # auto | always | never
    events: bool = True
    events_host: str = "127.0.0.1"
    events_port: int = 0                 # 0 = a free port
    events_advertise_host: str | None = None   # the address announced to the router (default: events_host)
    events_token: str | None = field(default=None, repr=False)   # subscribers must present it (ZeroMQ PLAIN)

    def __post_init__(self) -> None:
        if self.l2_gib < 0:
            raise ValueError(f"l2_gib must be >= 0, got {self.l2_gib}")
        if self.write_policy not in ("write-through", "write-back", "none"):
            raise ValueError(f"write_policy must be write-through, write-back or none, "
                             f"got {self.write_policy!r}")


@dataclass
class _Load:
    seq: Sequence
    first_block: int
    n_l2: int
    n_l3: int


@dataclass
class TierStats:
    l1_evictions: int = 0
    l2_hits: int = 0          # blocks loaded from L2
    l2_evictions: int = 0
    l3_loaded: int = 0
    load_failures: int = 0    # planned blocks that had to be recomputed
    loaded_tokens: dict[str, int] = field(default_factory=lambda: {"L2": 0, "L3": 0})


class TieredKV(ExternalPrefixSource):
    """Owns L2/L3 for one engine and implements the scheduler's external prefix source."""

    def __init__(self, cfg: TierConfig, kv_caches: torch.Tensor, pool: BlockPool, block_size: int,
                 worker_id: str = "worker") -> None:
        self.cfg, self.kv, self.pool, self.bs = cfg, kv_caches, pool, block_size
        # One block across layers: kv[:, :, block_id] -> [layers, 2, bs, kvh, hd]
        self.block_shape = tuple(kv_caches[:, :, 0].shape)
        self.dtype_name = str(kv_caches.dtype).removeprefix("torch.")
        cap = HostKVPool.capacity_for(cfg.l2_gib, self.block_shape, kv_caches.dtype)
        self.l2 = HostKVPool(cap, self.block_shape, kv_caches.dtype, pin=kv_caches.is_cuda)
        self.block_bytes = kv_caches[:, :, 0].numel() * kv_caches.element_size()
        self.l3 = MooncakeL3(cfg.l3, self.block_bytes, self.dtype_name, self.block_shape) if cfg.l3 else None
        self.cost = LoadCostModel(cfg.load_policy)
        self.stats = TierStats()
        self.events = KVEventPublisher(worker_id, cfg.events_host, cfg.events_port,
                                       advertise_host=cfg.events_advertise_host,
                                       token=cfg.events_token) if cfg.events else None
        self._pending_events: list = []
        self._plans: dict[str, tuple[int, int]] = {}
        self._loads: list[_Load] = []
        self._to_put: list[KVBlock] = []
        pool.add_evict_hook(self._on_l1_evict)
        pool.add_seal_hook(self._on_seal)

    # -- scheduler seam ------------------------------------------------------
    def lookup(self, seq: Sequence, num_local_blocks: int) -> int:
        hashes = seq.full_block_hashes()[:(seq.num_tokens - 1) // self.bs][num_local_blocks:]
        n2, n3 = self.cost.plan(hashes, self.l2.count_prefix, self.l3.count_prefix if self.l3 else None,
                                self.block_bytes, self.bs)
        if n2 + n3:
            self._plans[seq.request_id] = (n2, n3)
        return n2 + n3

    def schedule_load(self, seq: Sequence, first_block: int, num_blocks: int) -> None:
        n2, n3 = self._plans.pop(seq.request_id)
        assert n2 + n3 == num_blocks
        self._loads.append(_Load(seq, first_block, n2, n3))

    def cancel(self, seq: Sequence) -> None:
        self._plans.pop(seq.request_id, None)

    # -- engine hooks --------------------------------------------------------
    def apply_loads(self) -> None:
        """Fill the blocks planned this step; roll progress back where a load fails."""
        loads, self._loads = self._loads, []
        for ld in loads:
            seq, hashes = ld.seq, ld.seq.full_block_hashes()
            ok = 0
            t0 = time.perf_counter()
            for i in range(ld.first_block, ld.first_block + ld.n_l2):
                src = self.l2.get(hashes[i])
                if src is None:
                    break
                self.kv[:, :, seq.block_ids[i]].copy_(src, non_blocking=True)
                ok += 1
            if ok:
                self.cost.observe_transfer("L2", ok * self.block_bytes, time.perf_counter() - t0)
            self.stats.l2_hits += ok
            self.stats.loaded_tokens["L2"] += ok * self.bs
            if ok == ld.n_l2 and ld.n_l3:
                start = ld.first_block + ok
                t0 = time.perf_counter()
                got = self.l3.get(hashes[start:start + ld.n_l3],
                                  lambda j, payload: self._from_bytes(seq.block_ids[start + j], payload))
                self.cost.observe_transfer("L3", got * self.block_bytes, time.perf_counter() - t0)
                self.stats.l3_loaded += got
                self.stats.loaded_tokens["L3"] += got * self.bs
                ok += got
            planned = ld.n_l2 + ld.n_l3
            if ok < planned:
                self.stats.load_failures += planned - ok
                seq.num_computed_tokens -= (planned - ok) * self.bs
                if seq.num_preemptions == 0:  # the hit was counted at this first schedule
                    seq.num_cached_tokens -= (planned - ok) * self.bs

    def after_step(self) -> None:
        """Write-through of blocks sealed this step; publish this step's events."""
        if self._to_put and self.l3 is not None:
            blocks, self._to_put = self._to_put, []
            live = [b for b in blocks if b.block_hash is not None]
            stored = self.l3.put([b.block_hash for b in live],
                                 lambda j, payload: self._to_bytes(live[j].block_id, payload))
            if stored:
                self._pending_events.append(BlockStored([b.block_hash for b in live[:stored]], None,
                                                        [], self.bs, "L3"))
        self._to_put = []
        if self.events is not None and self._pending_events:
            self.events.publish(self._pending_events)
        self._pending_events = []

    def close(self) -> None:
        if self.events is not None:
            self.events.close()
        if self.l3 is not None:
            self.l3.close()

    # -- internals -----------------------------------------------------------
    def _block_view(self, payload: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(payload).view(self.kv.dtype).view(self.block_shape)

    def _to_bytes(self, block_id: int, payload: np.ndarray) -> None:
        self._block_view(payload).copy_(self.kv[:, :, block_id])

    def _from_bytes(self, block_id: int, payload: np.ndarray) -> None:
        self.kv[:, :, block_id].copy_(self._block_view(payload))

    def _on_seal(self, blk: KVBlock) -> None:
        self._pending_events.append(BlockStored([blk.block_hash], None, list(blk.token_ids),
                                                self.bs, "L1"))
        if self.cfg.write_policy == "write-through":
            self._to_put.append(blk)

    def _on_l1_evict(self, blk: KVBlock) -> None:
        h = blk.block_hash
        self.stats.l1_evictions += 1
        self._pending_events.append(BlockRemoved([h], "L1"))
        if self.l2.index.capacity == 0 or h in self.l2:
            return
        victim = self.l2.peek_victim()
        if victim is not None:
            vh, vdata = victim
            self.stats.l2_evictions += 1
            self._pending_events.append(BlockRemoved([vh], "L2"))
            if self.cfg.write_policy == "write-back" and self.l3 is not None:
                data = vdata
                if self.l3.put([vh], lambda j, payload: self._block_view(payload).copy_(data)):
                    self._pending_events.append(BlockStored([vh], None, [], self.bs, "L3"))
        self.l2.put(h, self.kv[:, :, blk.block_id])
        self._pending_events.append(BlockStored([h], None, list(blk.token_ids), self.bs, "L2"))

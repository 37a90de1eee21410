"""Against a real, small Mooncake store: only blocks the store took are announced, and
blocks that leave the store behind the worker's back are withdrawn from the router's index."""

import os
import time

import torch

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.sequence import SamplingParams, Sequence
from warmpath.engine.tiered_kv import TierConfig, TieredKV
from warmpath.kv.block_pool import BlockPool
from warmpath.kv.events import KVEventSubscriber
from warmpath.kv.hashing import KVNamespace
from warmpath.kv.mooncake_service import MooncakeService
from warmpath.kv.mooncake_store import MooncakeConfig
from warmpath.routing.index import GlobalKVIndex

BS = 4
NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=BS)


def _run(tiers, bm, written, r):
    """Sequence ``r``: 8 blocks, sealed and written through (one engine step's flush)."""
    seq = Sequence(f"s{r}", list(range(r * 1000, r * 1000 + 32)), SamplingParams(), NS)
    assert bm.allocate_slots(seq, 32)
    seq.num_computed_tokens = 32
    bm.seal_full_blocks(seq)
    written.extend(tiers.after_step())
    bm.free(seq)


def _drain(sub, index):
    """Apply every published batch: poll until none has come for 0.5 s (one poll could return
    before the last batches of a step were sent, on a loaded machine)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = sub.poll(500)
        if not got:
            return
        for _, batch, _ in got:
            index.apply("w", batch, 0.0)


def test_store_full_then_evicting_keeps_the_index_honest():
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    # one block: [1 layer, 2, 4 tokens, 1 head, 8192] float32 = 256 KiB; 16 MiB holds 56 of them.
    # The master evicts half its objects once 60% full, and leases last 50 ms: what is
    # written and then idle is soon evicted by Mooncake itself, nobody telling the worker.
    kv = torch.zeros(1, 2, 8, BS, 1, 8192)
    pool = BlockPool(8, enable_caching=True)
    bm = BlockManager(pool, BS)
    flags = ("--eviction_high_watermark_ratio=0.6", "--eviction_ratio=0.5", "--default_kv_lease_ttl=50")
    with MooncakeService(segment_bytes=16 << 20, master_args=flags) as svc:
        l3 = MooncakeConfig(master=svc.master, metadata=svc.metadata, staging_blocks=8, op_timeout_s=5)
        tiers = TieredKV(TierConfig(l2_gib=0, l3=l3, write_mode="write-through",
                                    l3_check_interval_s=3600, l3_check_blocks=1000),   # checked when the test says
                         kv, pool, BS, "w")
        sub = KVEventSubscriber(tiers.events.endpoint, tiers.events.replay_endpoint)
        index = GlobalKVIndex()
        try:
            time.sleep(0.3)
            written: list[bytes] = []
            for r in range(4):             # 32 blocks: under the watermark, all accepted
                _run(tiers, bm, written, r)
            _drain(sub, index)
            assert len(written) == 32 and index.l3 == set(written) and tiers.l3.stats.rejected_full == 0
            deadline = time.time() + 20    # past the watermark: the master evicts on its own
            r = 4
            while time.time() < deadline and all(tiers.l3.exists(written)):
                _run(tiers, bm, written, r)
                r += 1
                time.sleep(0.2)
            alive = dict(zip(written, tiers.l3.exists(written)))
            evicted = {h for h, ok in alive.items() if not ok}
            assert evicted, "Mooncake evicted nothing past its watermark"
            _drain(sub, index)
            assert evicted <= index.l3     # the router still counts them until told
            tiers._next_check = 0.0
            tiers.idle()                   # the engine's idle time: check, withdraw, publish
            _drain(sub, index)
            assert not index.l3 & evicted  # withdrawn: the router stops counting evicted blocks
            assert tiers.stats.l3_removed >= len(evicted)
            assert index.l3 == set(tiers.rules.l3_known) <= {h for h, ok in alive.items() if ok}
        finally:
            sub.close()
            tiers.close()

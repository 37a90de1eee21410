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
from warmpath.kv.mooncake_store import NOT_FOUND, MooncakeConfig
from warmpath.router.index import GlobalKVIndex

BS = 4
NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=BS)


def test_store_full_then_evicting_keeps_the_index_honest():
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    # one block: [1 layer, 2, 4 tokens, 1 head, 8192] float32 = 256 KiB; 16 MiB holds 56 of them
    kv = torch.zeros(1, 2, 8, BS, 1, 8192)
    pool = BlockPool(8, enable_caching=True)
    bm = BlockManager(pool, BS)
    with MooncakeService(segment_bytes=16 << 20) as svc:
        l3 = MooncakeConfig(master=svc.master, metadata=svc.metadata, staging_blocks=8, op_timeout_s=5)
        tiers = TieredKV(TierConfig(l2_gib=0, l3=l3, write_policy="write-through",
                                    l3_check_interval_s=0.01, l3_check_blocks=1000), kv, pool, BS, "w")
        sub = KVEventSubscriber(tiers.events.endpoint, tiers.events.replay_endpoint)
        index = GlobalKVIndex()
        try:
            time.sleep(0.3)
            written = []

            def write(r):                  # a sequence of 8 blocks, sealed and written through
                seq = Sequence(f"s{r}", list(range(r * 1000, r * 1000 + 32)), SamplingParams(), NS)
                assert bm.allocate_slots(seq, 32)
                seq.num_computed_tokens = 32
                bm.seal_full_blocks(seq)
                written.extend(tiers.after_step())
                bm.free(seq)

            for r in range(10):            # 80 puts, 8 at a time
                write(r)
            rejected = tiers.l3.stats.rejected_full
            assert len(written) + rejected == 80 and rejected > 0      # NO_SPACE: not announced
            for _, batch, _ in sub.poll(1000):
                index.apply("w", batch, 0.0)
            assert index.l3 == set(written)
            # Blocks leave the store without telling the worker (the master evicts at its
            # watermark; here: removed by another client, which is observed the same way).
            gone = written[:5]
            deadline = time.time() + 15    # a leased object (just written) is not removed yet
            for h in gone:
                while (rc := tiers.l3._store.remove(tiers.l3.key(h))) not in (0, NOT_FOUND) \
                        and time.time() < deadline:
                    time.sleep(0.5)
                assert rc in (0, NOT_FOUND)    # NOT_FOUND: the master had evicted it already
            tiers._next_check = 0.0
            tiers.idle()                   # the engine's idle time: check, withdraw, publish
            for _, batch, _ in sub.poll(1000):
                index.apply("w", batch, 0.0)
            known = set(tiers.rules.l3_known)
            assert tiers.stats.l3_removed >= 5 and not index.l3 & set(gone) and index.l3 == known
            assert known == {h for h, ok in zip(written, tiers.l3.exists(written)) if ok}
        finally:
            sub.close()
            tiers.close()

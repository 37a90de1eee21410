"""The chaos run's L3 faults against a real, small Mooncake store: a bit flipped in place is
refused on load (``checksum``) and removed; junk past the segment makes the master evict."""

import os

from warmpath.kv.block_codec import BlockIdentity
from warmpath.kv.l3_faults import corrupt_blocks, fill_store
from warmpath.kv.mooncake_config import MooncakeConfig
from warmpath.kv.mooncake_service import MooncakeService
from warmpath.kv.mooncake_store import MooncakeL3

SHAPE = (2, 2, 16, 1, 64)          # layers, K/V, tokens, heads, head dim
NBYTES = 2 * 2 * 16 * 64 * 2        # float16


def _ident(i: int) -> BlockIdentity:
    return BlockIdentity.of(bytes([i]) * 16, None, bytes([i]) * 32, list(range(i, i + 16)))


def _client(svc: MooncakeService) -> MooncakeL3:
    cfg = MooncakeConfig(master=svc.master, metadata=svc.metadata, staging_blocks=4)
    return MooncakeL3(cfg, NBYTES, "float16", SHAPE, tag_key=b"k" * 32)


def test_a_flipped_bit_is_refused_then_removed_and_the_others_still_load():
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    with MooncakeService(segment_bytes=16 << 20) as svc:
        l3 = _client(svc)
        blocks = [_ident(i) for i in (1, 2, 3)]
        written, _ = l3.put(blocks, lambda i, p: p.fill(i + 1))
        assert len(written) == 3
        assert corrupt_blocks(l3, [blocks[1].block_hash, b"\x09" * 16], seed=5) == [blocks[1].block_hash]
        got = []
        assert l3.get(blocks, lambda i, p: got.append(int(p[0]))) == 1      # stops at the broken one
        assert got == [1]
        assert l3.rejected == [(blocks[1].block_hash, "checksum")] and l3.stats.corrupt == 1
        assert l3.exists([b.block_hash for b in blocks]) == [True, False, True]   # removed, not served
        assert l3.get([blocks[2]], lambda i, p: got.append(int(p[0]))) == 1 and got == [1, 3]
        l3.close()


def test_filling_the_store_past_its_segment_makes_room_by_eviction():
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    with MooncakeService(segment_bytes=16 << 20) as svc:
        l3 = _client(svc)
        blocks = [_ident(i) for i in range(1, 9)]
        assert len(l3.put(blocks, lambda i, p: p.fill(1))[0]) == 8
        res = fill_store(l3, 48 << 20, object_bytes=1 << 20)
        assert res["put"] > 16 and res["no_space"] < 50 and res["bytes"] == res["put"] << 20      # more than the segment holds
        present = l3.exists([b.block_hash for b in blocks])
        assert present is not None and not all(present)                  # the old blocks were evicted
        l3.close()

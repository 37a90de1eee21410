"""L2 hands out a block only if it is the one asked for and its bytes are intact; its
storage (and L1's) is zeros whose pages are committed only when written."""

import torch

from warmpath.kv.block_codec import BlockIdentity
from warmpath.kv.hashing import KVNamespace, digest_prefix_blocks, hash_prefix_blocks
from warmpath.kv.host_pool import HostKVPool, lazy_zeros

MIB = 1 << 20

SHAPE = (2, 2, 4, 1, 8)
NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=4)
TOKENS = list(range(100, 112))
H = hash_prefix_blocks(NS, TOKENS)
D = digest_prefix_blocks(NS, TOKENS)
IDS = [BlockIdentity.of(H[i], H[i - 1] if i else None, D[i], TOKENS[4 * i:4 * i + 4]) for i in range(3)]


def pool(checksum=True):   # (the tiers' default is False: TierConfig.l2_checksum)
    p = HostKVPool(2, SHAPE, torch.float32, checksum=checksum)
    for i in (0, 1):
        assert p.put(IDS[i], torch.full(SHAPE, float(i))) is None
    return p


def test_the_right_block_comes_back():
    p = pool()
    data, why = p.get(IDS[1])
    assert why is None and torch.equal(data, torch.full(SHAPE, 1.0))
    assert p.get(IDS[2]) == (None, None)                     # never stored: a plain miss
    assert p.put(IDS[2], torch.zeros(SHAPE)) == H[0]         # LRU: block 0 was used least recently
    assert p.peek_victim()[0] == IDS[1]                      # the victim's identity travels with it (spill)
    p.index.check_integrity()


def test_a_flipped_bit_is_refused_and_dropped():
    p = pool()
    p.data[0].view(-1).view(torch.uint8)[37] ^= 0x10         # one bit of block 0's bytes
    assert p.get(IDS[0]) == (None, "checksum")
    assert H[0] not in p and H[1] in p and len(p.index) == 1
    p.index.check_integrity()


def test_another_prefix_under_the_same_key_is_refused_and_kept():
    p = pool()
    other = BlockIdentity.of(H[1], H[0], D[1], [1, 2, 3, 4])
    assert p.get(other) == (None, "tokens")
    assert p.get(BlockIdentity.of(H[1], b"x" * 16, D[1], TOKENS[4:8])) == (None, "parent")
    assert p.get(BlockIdentity.of(H[1], H[0], b"y" * 32, TOKENS[4:8])) == (None, "prefix")
    assert H[1] in p and p.get(IDS[1])[1] is None            # still there for its own prefix


def test_a_slot_holding_another_key_is_dropped():
    p = pool()
    slot = p.index.get(H[1])
    p.idents[slot] = IDS[0]                                   # a bookkeeping bug: slot and key disagree
    assert p.get(IDS[1]) == (None, "key") and H[1] not in p


def test_without_checksums_bytes_are_not_checked():
    p = pool(checksum=False)
    p.data[0].view(-1)[0] = 9.0
    data, why = p.get(IDS[0])
    assert why is None and data.view(-1)[0].item() == 9.0
    assert p.sums == [None, None]


def rss_anon() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def test_lazy_zeros_reads_as_zeros_and_costs_only_what_is_written():
    before = rss_anon()
    t = lazy_zeros((64, 1024, 1024), torch.float32)          # 256 MiB
    assert t.shape == (64, 1024, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert rss_anon() - before < 8 * MIB
    t[3].fill_(1.5)                                          # one 4 MiB slab written
    grown = rss_anon() - before
    assert 4 * MIB <= grown < 16 * MIB
    assert t[3].sum().item() == 1.5 * 1024 * 1024 and t[2].abs().sum().item() == 0
    assert lazy_zeros((0, 4), torch.float32).shape == (0, 4)
    assert lazy_zeros((2, 3), torch.bfloat16).eq(0).all()
    assert HostKVPool(4, SHAPE, torch.float32).data.eq(0).all()

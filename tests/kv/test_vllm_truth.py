"""The truth index fidelity is measured against: vLLM's cached blocks by its own events
(stored minus removed per hash and tier, cleared on AllBlocksCleared), with the warmpath key
the rebuilder gave each, re-keyed or not. Events hand-made as vLLM 0.32 decodes them."""

from warmpath.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks
from warmpath.kv.vllm_events import VLLMKeyRebuilder
from warmpath.kv.vllm_truth import VLLMCacheTruth, block_id

NS = KVNamespace("SmolLM2-135M-Instruct", "vllm:test", "vllm-auto", 4, "tok")
H = [bytes([i]) * 32 for i in range(1, 9)]          # vLLM's sha256 block hashes (opaque)
TOKENS = list(range(100, 108))                       # 2 blocks of 4
K = [k.hex() for k in hash_prefix_blocks(NS, TOKENS)]


def feed(truth: VLLMCacheTruth, rebuilder: VLLMKeyRebuilder, *events) -> dict:
    """As the relay does: translate the batch, then fold it into the truth; the snapshot."""
    rebuilder.translate(list(events))
    truth.apply(list(events), rebuilder.keys.get)
    return truth.snapshot()


def test_stored_removed_and_cleared_by_hash_and_tier():
    t, r = VLLMCacheTruth(), VLLMKeyRebuilder(NS)
    s = feed(t, r, BlockStored(H[:2], None, TOKENS, 4, "GPU"))
    assert s == {"blocks": 2, "keys": {K[0]: 1, K[1]: 1}, "unkeyed": [], "other_medium": 0, "unmatched_removes": 0}
    # vLLM cached a second block under H[0] (two requests computed it at once): one removal leaves one
    feed(t, r, BlockStored([H[0]], None, TOKENS[:4], 4, "GPU"))
    assert feed(t, r, BlockRemoved([H[0]], "GPU"))["keys"] == {K[0]: 1, K[1]: 1}
    s = feed(t, r, BlockRemoved([H[0]], "GPU"))
    assert (s["blocks"], s["keys"]) == (1, {K[1]: 1})
    assert feed(t, r, BlockRemoved([H[0]], "GPU"))["unmatched_removes"] == 1     # nothing left to remove
    # H[1] copied to host memory (L2), then evicted from the device (L1): still cached
    feed(t, r, BlockStored([H[1]], H[0], TOKENS[4:], 4, "CPU"))
    s = feed(t, r, BlockRemoved([H[1]], "GPU"))
    assert (s["blocks"], s["keys"]) == (1, {K[1]: 1})
    # a medium warmpath does not index: counted, not cached
    s = feed(t, r, BlockStored([H[4]], None, TOKENS[:4], 4, "STORAGE"))
    assert (s["blocks"], s["other_medium"]) == (1, 1)
    assert feed(t, r, AllBlocksCleared()) == {"blocks": 0, "keys": {}, "unkeyed": [], "other_medium": 1,
                                              "unmatched_removes": 1}
    assert len(t) == 0


def test_blocks_warmpath_could_not_rekey_are_cached_without_a_key():
    t, r = VLLMCacheTruth(), VLLMKeyRebuilder(NS)
    s = feed(t, r, BlockStored([H[5]], H[6], [1, 2, 3, 4], 4, "GPU"),          # parent never seen
             BlockStored([H[7]], None, list(range(16)), 16, "GPU"))             # another block size
    assert s == {"blocks": 2, "keys": {}, "unkeyed": [H[5].hex(), H[7].hex()], "other_medium": 0,
                 "unmatched_removes": 0}
    assert r.stats.orphans == 1 and r.stats.bad_block_size == 1
    # the same warmpath key under two vLLM hashes (another cache_salt): both count, one key
    s = feed(t, r, BlockStored([H[0]], None, TOKENS[:4], 4, "GPU"), BlockStored([H[1]], None, TOKENS[:4], 4, "GPU"))
    assert (s["blocks"], s["keys"]) == (4, {K[0]: 2})
    s = feed(t, r, BlockRemoved([H[5], H[1]], "GPU"))
    assert (s["blocks"], s["keys"], s["unkeyed"]) == (2, {K[0]: 1}, [H[7].hex()])
    assert block_id(12345) == "12345"                                           # older vLLM's int hashes

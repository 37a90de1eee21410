import random
import threading

import pytest

from warmpath.kv.hash_cache import BlockHashCache, common_blocks
from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks, pack_tokens

NS = KVNamespace("m", "r", "float32", 4)


def test_follow_up_hashes_only_its_new_blocks():
    cache = BlockHashCache()
    a = list(range(10))                                  # 2 full blocks
    b = a + [50, 51, 52, 53, 54, 55, 56]                 # 4 full blocks, the first 2 of a
    assert cache.hashes(NS, a, "s1") == tuple(hash_prefix_blocks(NS, a))
    assert (cache.reused_blocks, cache.hashed_blocks) == (0, 2)
    hb = cache.hashes(NS, b, "s1")
    assert hb == tuple(hash_prefix_blocks(NS, b))
    assert (cache.reused_blocks, cache.hashed_blocks) == (2, 4)


def test_divergence_inside_a_block_rehashes_that_block():
    prev = list(range(1, 13))                            # blocks [1-4] [5-8] [9-12]
    new = [1, 2, 3, 4, 5, 6, 99, 8, 9, 10, 11, 12]       # differs at token 6: block 1 on
    assert common_blocks(pack_tokens(prev), pack_tokens(new), 4) == 1
    assert common_blocks(pack_tokens(prev), pack_tokens(prev[:11]), 4) == 2
    assert common_blocks(pack_tokens(prev), pack_tokens([7]), 4) == 0
    cache = BlockHashCache()
    cache.hashes(NS, prev, "s")
    assert cache.hashes(NS, new, "s") == tuple(hash_prefix_blocks(NS, new))
    assert (cache.reused_blocks, cache.hashed_blocks) == (1, 3 + 2)


def test_first_block_finds_another_session_and_salts_never_share():
    cache = BlockHashCache()
    system = list(range(8))
    cache.hashes(NS, system + [1, 1, 1, 1], "alice")
    assert cache.hashes(NS, system + [2, 2, 2, 2], "bob") == tuple(hash_prefix_blocks(NS, system + [2, 2, 2, 2]))
    assert cache.reused_blocks == 2                      # bob's first turn: alice's system prompt
    salted = NS.with_salt("tenant")
    assert cache.hashes(salted, system, "alice") == tuple(hash_prefix_blocks(salted, system))
    assert cache.reused_blocks == 2


def test_bounded_by_entries_and_tokens():
    cache = BlockHashCache(max_entries=3, max_tokens=100)
    for i in range(5):                                   # each prompt: a session key + its first block
        cache.hashes(NS, [i] * 8, f"s{i}")
    assert len(cache) == 3
    cache = BlockHashCache(max_entries=100, max_tokens=20)
    cache.hashes(NS, [1] * 8, "a")                       # 2 keys x 8 tokens
    cache.hashes(NS, [2] * 8, "b")
    assert len(cache) == 2 and cache._tokens == 16
    cache.hashes(NS, [3] * 24, "c")                      # larger than the budget: not kept
    assert cache._tokens <= 20
    with pytest.raises(ValueError, match="max_entries"):
        BlockHashCache(max_entries=0)


def test_random_sessions_match_fresh_hashing_from_several_threads():
    base = [random.Random(0).randrange(1 << 20) for _ in range(64)]
    cache, errors = BlockHashCache(max_entries=8), []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        prompt = base[:rng.randrange(64)]
        for _ in range(60):
            if rng.random() < 0.2:                       # an edit: cut back, then go on
                prompt = prompt[:rng.randrange(len(prompt) + 1)]
            prompt = prompt + [rng.randrange(1 << 20) for _ in range(rng.randrange(1, 20))]
            got = cache.hashes(NS, prompt, f"s{seed % 3}")
            if got != tuple(hash_prefix_blocks(NS, prompt)):
                errors.append((seed, len(prompt)))

    threads = [threading.Thread(target=client, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and cache.reused_blocks > 0 and len(cache) <= 8


def test_token_arrays_hash_incrementally_like_lists():
    from warmpath.kv.hashing import token_array
    cache = BlockHashCache()
    a = token_array(range(1000, 1403))                   # 100 full blocks (+3)
    b = a + token_array([5] * 37)                        # the follow-up: 9 more blocks, the 101st block completed
    assert cache.hashes(NS, a, "s") == tuple(hash_prefix_blocks(NS, list(a)))
    assert cache.hashes(NS, b, "s") == tuple(hash_prefix_blocks(NS, list(b)))
    assert (cache.reused_blocks, cache.hashed_blocks) == (100, 100 + 10)


def test_a_session_id_alone_is_never_trusted():
    cache = BlockHashCache()
    cache.hashes(NS, list(range(40)), "s")
    other = [7] + list(range(1, 40))                     # same length and session, first token differs
    assert cache.hashes(NS, other, "s") == tuple(hash_prefix_blocks(NS, other))
    assert cache.reused_blocks == 0 and cache.hashed_blocks == 20
    edited = other[:22] + [9] * 18                       # an edit inside block 5: blocks 0-4 reused
    assert cache.hashes(NS, edited, "s") == tuple(hash_prefix_blocks(NS, edited))
    assert cache.reused_blocks == 5

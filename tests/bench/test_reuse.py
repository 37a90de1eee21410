"""The cold / warm / turn rule from measured reuse (bench/reuse.py), on hand-made prompts."""

from pathlib import Path

from warmpath.bench.reuse import PrefixOverlap, block_hashes, measured_class, reuse_class
from warmpath.bench.workload import mooncake_trace

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def test_threshold_is_half_the_prompt():
    assert reuse_class(100, 50) == "warm" and reuse_class(100, 49) == "cold"
    assert reuse_class(0, 0) == "cold"
    # the reported cached tokens decide when there are some; else the overlap
    assert measured_class(100, 10, 64) == ("cold", "cached")
    assert measured_class(100, None, 64) == ("warm", "overlap")
    assert measured_class(100, 0, 64) == ("cold", "cached")       # 0 reported is a measurement


def test_classification_of_a_hand_made_sequence_by_overlap():
    """Blocks of 4 tokens. A; B = A + one block (continues A: turn 2); C shares A's first
    block only; D = B + 2 tokens (continues B: turn 3); E repeats A (a repeat, not a turn)."""
    a = list(range(1, 9))
    b = a + [9, 10, 11, 12]
    c = [1, 2, 3, 4] + list(range(50, 58))
    d = b + [13, 14]
    seen = PrefixOverlap(block=4)
    got = []
    for p in (a, b, c, d, a):
        ov = seen.observe(block_hashes(p, 4), len(p))
        got.append((ov.tokens, ov.turn, measured_class(len(p), None, ov.tokens)[0]))
    assert got == [(0, 1, "cold"), (8, 2, "warm"), (4, 1, "cold"), (12, 3, "warm"), (8, 1, "warm")]
    # a session's own turn, when known, is kept
    assert seen.observe(block_hashes(d + [15, 16], 4), 16, turn=7).turn == 7


def test_memory_is_bounded_by_forgetting_the_oldest_blocks():
    seen = PrefixOverlap(block=4, max_blocks=2)
    a, c = list(range(8)), list(range(100, 108))
    assert seen.observe(block_hashes(a, 4), 8).tokens == 0
    assert seen.observe(block_hashes(c, 4), 8).tokens == 0      # evicts a's 2 blocks
    assert seen.observe(block_hashes(a, 4), 8).tokens == 0
    assert seen.observe(block_hashes(a, 4), 8).tokens == 8


def test_mooncake_hash_ids_overlap_in_whole_blocks():
    """Rows 0 and 1 of the conversation trace share hash_id 0 (512 tokens) and nothing else."""
    r0, r1 = (s.turns[0].new_tokens for s in mooncake_trace(TRACES / "mooncake_conversation.jsonl", limit=2))
    seen = PrefixOverlap()
    assert seen.observe(block_hashes(r0), len(r0)).tokens == 0
    ov = seen.observe(block_hashes(r1), len(r1))
    assert (ov.tokens, ov.turn) == (512, 1)
    assert block_hashes(r0)[:32] == block_hashes(r1)[:32] and block_hashes(r0)[32] != block_hashes(r1)[32]

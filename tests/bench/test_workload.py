from pathlib import Path

import pytest

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.bench.workload import (PPD_FIRST, PPD_FOLLOW, block_tokens, coding_agent, csv_trace,
                                     mooncake_trace, multi_turn_chat, ppd_grid)

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def test_mooncake_trace_parsing_on_shared_trace():
    ss = mooncake_trace(TRACES / "mooncake_conversation.jsonl", limit=3)
    assert [len(s.turns[0].new_tokens) for s in ss] == [6758, 7322, 7236]
    assert [s.turns[0].max_tokens for s in ss] == [500, 490, 794]
    assert [s.start for s in ss] == [0.0, 0.0, 0.0]
    # rows 1 and 2 share hash_id 0: their first 512 tokens are equal, the next block differs
    a, b = ss[0].turns[0].new_tokens, ss[1].turns[0].new_tokens
    assert a[:512] == b[:512] and a[512:1024] != b[512:1024]


def test_equal_hash_ids_give_equal_blocks():
    assert block_tokens(7, 16) == block_tokens(7, 16)
    assert block_tokens(7, 16) != block_tokens(8, 16)
    assert len(block_tokens(3, 512)) == 512


def test_scaled_trace_and_csv():
    ss = mooncake_trace(TRACES / "mooncake_synthetic.jsonl", block_tokens_=16, limit=5, max_output=8)
    # 512-token blocks scaled to 16: lengths / 32 (40160 → 1255); the trace's own times (ms → s)
    assert [len(s.turns[0].new_tokens) for s in ss[:2]] == [1255, 1145]
    assert all(1 <= s.turns[0].max_tokens <= 8 for s in ss)
    assert [s.start for s in ss[2:4]] == [0.04, 0.277]
    # another salt: the same shape with other token ids (a fresh rate point on a warm server)
    salted = mooncake_trace(TRACES / "mooncake_synthetic.jsonl", block_tokens_=16, limit=5, max_output=8, salt=1)
    assert [len(s.turns[0].new_tokens) for s in salted] == [len(s.turns[0].new_tokens) for s in ss]
    assert salted[0].turns[0].new_tokens[:16] != ss[0].turns[0].new_tokens[:16]
    cs = csv_trace(TRACES / "azure_code.csv", token_scale=0.01, limit=2)
    assert [len(s.turns[0].new_tokens) for s in cs] == [48, 31]
    assert [s.start for s in cs] == [0.0, 0.052]


def test_ppd_grid_covers_2x9():
    ss = ppd_grid(18)
    combos = {(len(s.turns[0].new_tokens), s.turns[0].max_tokens, len(s.turns[1].new_tokens),
               s.turns[1].max_tokens) for s in ss}
    assert combos == {(a, b, c, d) for a, b in PPD_FIRST for c, d in PPD_FOLLOW}


def test_coding_agent_marks_first_use_cold_and_reuse_warm():
    ss = coding_agent(40, seed=1, scale=0.1)
    agents = [s for s in ss if s.sid.startswith("agent")]
    docs = [s for s in ss if s.sid.startswith("doc")]
    assert agents and docs
    seen, warm = set(), 0
    for s in agents:
        key = tuple(s.prefix[:8])
        assert s.turns[0].cls == ("warm" if key in seen else "cold")
        warm += key in seen
        seen.add(key)
    assert warm > 0 and all(s.turns[0].cls == "cold" and len(s.turns) == 1 for s in docs)


def test_chat_is_deterministic_per_seed():
    a, b = multi_turn_chat(5, seed=3), multi_turn_chat(5, seed=3)
    assert [[t.new_tokens for t in s.turns] for s in a] == [[t.new_tokens for t in s.turns] for s in b]


def test_arrivals_rate_and_ramp():
    ts = arrival_times(ArrivalConfig(rate=20, duration_s=100, seed=0))
    assert abs(len(ts) / 100 - 20) < 1.0 and ts == sorted(ts)
    bursty = arrival_times(ArrivalConfig(rate=20, duration_s=100, burstiness=0.2, seed=0))
    gaps = [b - a for a, b in zip(bursty, bursty[1:])]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert cv > 1.5  # gamma shape 0.2: CV = 1/sqrt(0.2) ≈ 2.2
    ramp = arrival_times(ArrivalConfig(rate=20, duration_s=10, ramp_s=10, seed=0))
    first_half = sum(1 for t in ramp if t < 5)
    assert first_half < sum(1 for t in ramp if 5 <= t < 10) < sum(1 for t in ramp if t >= 10)
    with pytest.raises(ValueError):
        ArrivalConfig(rate=0, duration_s=1)

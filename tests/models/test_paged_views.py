"""Attention over paged KV read in place (``paged``) vs the former gather path, on random caches."""

import pytest
import torch

from warmpath.models.attention import AttentionMetadata, paged_attention
from warmpath.models.paged_views import MAX_RUNS, block_runs, merge

BS, H, KVH, D, NB = 4, 6, 2, 8, 64


def test_block_runs_cut_at_breaks_and_count_used_tokens():
    assert block_runs([7, 8, 9, 3, 4], 70, 16) == [(7, 10, 48), (3, 5, 22)]
    assert block_runs([5, 6, 2], 33, 16) == [(5, 7, 32), (2, 3, 1)]
    assert block_runs([5, 6, 2], 16, 16) == [(5, 6, 16)]      # blocks past the tokens ignored
    assert block_runs([1], 0, 16) == []
    with pytest.raises(ValueError, match="2 blocks cannot hold 33"):
        block_runs([1, 2], 33, 16)


def test_merge_of_two_halves_equals_softmax_over_all():
    s = torch.tensor([[0.5, -1.0, 2.0, 0.0]])
    v = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    full = s.softmax(-1) @ v
    halves = [((s[:, i:i + 2].softmax(-1) @ v[i:i + 2]), s[:, i:i + 2].logsumexp(-1)) for i in (0, 2)]
    o, lse = merge(halves)
    assert torch.allclose(o, full, atol=1e-6) and torch.allclose(lse, s.logsumexp(-1))


def _tables(lens: list[int], layout: str, gen: torch.Generator) -> list[list[int]]:
    need = [-(-n // BS) for n in lens]
    if layout == "consecutive":
        ids = list(range(NB))
    else:   # shuffled: nearly every block its own run
        ids = torch.randperm(NB, generator=gen).tolist()
    out, at = [], 0
    for n in need:
        out.append(ids[at:at + n])
        at += n
    if layout == "two_runs":            # each table split once in the middle, halves swapped
        out = [t[len(t) // 2:] + t[:len(t) // 2] if len(t) > 1 else t for t in out]
    return out


@pytest.mark.parametrize("layout", ["consecutive", "two_runs", "shuffled"])
def test_decode_equals_gather_on_ragged_lengths(layout):
    gen = torch.Generator().manual_seed(1)
    cache = torch.randn(2, NB, BS, KVH, D, generator=gen)
    lens = [1, 5, 4, 17, 30]   # ragged; 30 tokens shuffled = 8 runs > MAX_RUNS (gathered)
    tables = _tables(lens, layout, gen)
    slots = [t[(n - 1) // BS] * BS + (n - 1) % BS for t, n in zip(tables, lens)]
    q = torch.randn(len(lens), H, D, generator=gen)
    k, v = torch.randn(len(lens), KVH, D, generator=gen), torch.randn(len(lens), KVH, D, generator=gen)
    outs = {}
    for impl in ("gather", "paged"):
        c = cache.clone()
        meta = AttentionMetadata.build(BS, tables, lens, [], slots, torch.device("cpu"), impl=impl)
        outs[impl] = paged_attention(q, k, v, c, meta, 0.3)
    if layout == "shuffled":
        assert len(block_runs(tables[4], 30, BS)) > MAX_RUNS
    assert (outs["paged"] - outs["gather"]).abs().max().item() < 2e-6
    # length 1: the output is that token's value row, exactly (softmax of one key)
    assert torch.equal(outs["paged"][0].view(KVH, H // KVH, D)[1, 0], v[0, 1])


@pytest.mark.parametrize("layout", ["consecutive", "two_runs", "shuffled"])
def test_prefill_chunks_over_cached_prefixes_equal_gather(layout):
    gen = torch.Generator().manual_seed(2)
    cache = torch.randn(2, NB, BS, KVH, D, generator=gen)
    # (q_len, ctx_len): a chunk starting mid-block, one block-aligned, one with no prefix,
    # one decode-sized chunk of 2 after a 29-token prefix
    spans = [(6, 11), (8, 16), (5, 5), (2, 31)]
    tables = _tables([c for _, c in spans], layout, gen)
    slots = [t[p // BS] * BS + p % BS for (q, c), t in zip(spans, tables) for p in range(c - q, c)]
    nt = sum(q for q, _ in spans)
    q = torch.randn(nt, H, D, generator=gen)
    k, v = torch.randn(nt, KVH, D, generator=gen), torch.randn(nt, KVH, D, generator=gen)
    prefill = [(ql, c, t) for (ql, c), t in zip(spans, tables)]
    outs = {}
    for impl in ("gather", "paged"):
        c = cache.clone()
        meta = AttentionMetadata.build(BS, [], [], prefill, slots, torch.device("cpu"), impl=impl)
        outs[impl] = paged_attention(q, k, v, c, meta, 0.3)
    assert (outs["paged"] - outs["gather"]).abs().max().item() < 2e-6


def test_mixed_step_decodes_then_chunks_and_bad_impl_named():
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(2, NB, BS, KVH, D, generator=gen)
    tables = [[3, 4, 5], [9, 10], [20, 21, 22, 23]]
    dec_ctx = [9, 8]
    slots = [5 * BS + 0, 10 * BS + 3] + [t for t in range(20 * BS + 10, 20 * BS + 14)]
    q = torch.randn(6, H, D, generator=gen)
    k, v = torch.randn(6, KVH, D, generator=gen), torch.randn(6, KVH, D, generator=gen)
    outs = {}
    for impl in ("gather", "paged"):
        meta = AttentionMetadata.build(BS, tables[:2], dec_ctx, [(4, 14, tables[2])], slots,
                                       torch.device("cpu"), impl=impl)
        outs[impl] = paged_attention(q, k, v, cache.clone(), meta, 0.3)
    assert (outs["paged"] - outs["gather"]).abs().max().item() < 2e-6
    with pytest.raises(ValueError, match="attention impl must be one of"):
        AttentionMetadata.build(BS, [], [], [], [], torch.device("cpu"), impl="flash")

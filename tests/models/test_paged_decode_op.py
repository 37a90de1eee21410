"""``torch.ops.warmpath.paged_decode``: the C kernel (``native/paged_decode.c``) against a
float64 softmax and hand-worked numbers, its cache writes, batch invariance, bad input, the
torch fallback, and the op inside ``torch.compile(fullgraph=True)`` with a dynamic batch."""

import math

import pytest
import torch

from warmpath.models import paged_decode_op as op

CPU = torch.device("cpu")


def test_the_install_step_built_the_kernel():
    # setup.py builds it (``pip install -e .``); without it CPU decode runs the torch formulation
    assert op.available(), "warmpath.models._paged is not built: run `pip install -e .` (needs a C compiler)"


def test_hand_worked_case_gqa_two_heads_over_a_reversed_table():
    # bs 2, one KV head, two query heads (G = 2), D = 2, scale 1; table [2, 0]: tokens 0, 1 in
    # block 2, token 2 (this step's, written by the op at slot 0) in block 0
    kc, vc = torch.zeros(3, 2, 1, 2), torch.zeros(3, 2, 1, 2)
    kc[2, 0, 0], kc[2, 1, 0] = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])
    vc[2, 0, 0], vc[2, 1, 0] = torch.tensor([7.0, 0.0]), torch.tensor([0.0, 7.0])
    q = torch.tensor([[[0.0, 0.0], [math.log(2.0), 0.0]]])
    k, v = torch.tensor([[[2.0, 0.0]]]), torch.tensor([[[0.0, 0.0]]])
    out = op.decode(q, k, v, kc, vc, torch.tensor([0]), torch.tensor([[2, 0]], dtype=torch.int32),
                    torch.tensor([3]), 1.0)
    # head 0: scores 0, 0, 0 -> the mean of the values (7/3, 7/3)
    # head 1: scores ln2, 0, 2 ln2 -> weights 2 : 1 : 4 -> (2·7, 1·7) / 7 = (2, 1)
    assert torch.allclose(out, torch.tensor([[[7 / 3, 7 / 3], [2.0, 1.0]]]), rtol=1e-6, atol=0)
    assert kc[0, 0, 0].tolist() == [2.0, 0.0] and vc[0, 0, 0].tolist() == [0.0, 0.0]


def _case(lens, bs=4, h=6, kvh=2, d=8, nb=64, seed=0, width_pad=1, int64=False):
    """Random caches, shuffled (non-contiguous) block tables padded past their use, the slot of
    each sequence's last token; everything on CPU float32."""
    gen = torch.Generator().manual_seed(seed)
    kc, vc = torch.randn(nb, bs, kvh, d, generator=gen), torch.randn(nb, bs, kvh, d, generator=gen)
    ids, tables, at = torch.randperm(nb, generator=gen).tolist(), [], 0
    for n in lens:
        tables.append(ids[at:at + -(-n // bs)])
        at += len(tables[-1])
    w = max(len(t) for t in tables) + width_pad
    tab = torch.tensor([t + [nb - 1] * (w - len(t)) for t in tables],
                       dtype=torch.int64 if int64 else torch.int32)
    slots = torch.tensor([t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens)])
    q = torch.randn(len(lens), h, d, generator=gen)
    k, v = torch.randn(len(lens), kvh, d, generator=gen), torch.randn(len(lens), kvh, d, generator=gen)
    return q, k, v, kc, vc, slots, tab, torch.tensor(lens), tables


def _reference(q, kc, vc, tables, lens, scale):
    """float64 softmax attention, one sequence and head at a time (the caches already written)."""
    bs, kvh, d = kc.shape[1], kc.shape[2], kc.shape[3]
    g = q.shape[1] // kvh
    out = torch.empty(q.shape, dtype=torch.float64)
    for b, (t, n) in enumerate(zip(tables, lens)):
        rows = [t[p // bs] * bs + p % bs for p in range(n)]
        kk, vv = kc.reshape(-1, kvh, d)[rows].double(), vc.reshape(-1, kvh, d)[rows].double()
        for hh in range(q.shape[1]):
            s = kk[:, hh // g] @ q[b, hh].double() * scale
            out[b, hh] = torch.softmax(s, 0) @ vv[:, hh // g]
    return out


@pytest.mark.parametrize("d", [1, 8, 64, 67, 128])
@pytest.mark.parametrize("int64", [False, True])
def test_ragged_shuffled_gqa_equals_float64_softmax(d, int64):
    lens = [1, 3, 4, 5, 17, 30, 129]       # ctx 1, within a block, block-aligned, ragged
    q, k, v, kc, vc, slots, tab, ctx, tables = _case(lens, d=d, nb=80, int64=int64)
    out = op.decode(q, k, v, kc, vc, slots, tab, ctx, d ** -0.5)
    want = _reference(q, kc, vc, tables, lens, d ** -0.5)
    assert (out.double() - want).abs().max().item() < 2e-6
    # ctx 1: the output is that token's value row, exactly, for every head of its group
    assert torch.equal(out[0, 3], v[0, 1]) and torch.equal(out[0, 0], v[0, 0])


def test_sequences_cut_into_chunks_merge_to_the_float64_softmax():
    lens = [512, 513, 1100, 2048]          # chunks of 512 tokens: 1, 2, 3 and 4 of them
    q, k, v, kc, vc, slots, tab, ctx, tables = _case(lens, bs=16, d=64, nb=300, seed=7)
    out = op.decode(q, k, v, kc, vc, slots, tab, ctx, 0.125)
    assert (out.double() - _reference(q, kc, vc, tables, lens, 0.125)).abs().max().item() < 2e-6


def test_writes_land_at_the_slots_and_nothing_else_changes():
    q, k, v, kc, vc, slots, tab, ctx, _ = _case([2, 9, 16], nb=16)
    before_k, before_v = kc.clone(), vc.clone()
    op.decode(q, k, v, kc, vc, slots, tab, ctx, 0.3)
    before_k.view(-1, 2, 8)[slots] = k
    before_v.view(-1, 2, 8)[slots] = v
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)


def test_padding_rows_with_slot_minus_one_write_nothing():
    q, k, v, kc, vc, slots, tab, ctx, _ = _case([2, 9, 16], nb=16)
    slots[1] = -1
    before_k, before_v = kc.clone(), vc.clone()
    kc2, vc2 = kc.clone(), vc.clone()
    native = op.decode(q, k, v, kc, vc, slots, tab, ctx, 0.3)
    fallback = op.torch_decode(q, k, v, kc2, vc2, slots, tab, ctx, 0.3)
    for i in (0, 2):
        before_k.view(-1, 2, 8)[slots[i]], before_v.view(-1, 2, 8)[slots[i]] = k[i], v[i]
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)
    assert torch.equal(kc2, before_k) and (native - fallback).abs().max().item() < 2e-6


def test_strided_q_and_v_rows_are_read_as_they_lie():
    q, k, v, kc, vc, slots, tab, ctx, tables = _case([5, 12])
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], 1)   # rows of [q | k | v]
    qs, ks, vs = qkv.split([48, 16, 16], 1)
    out = op.decode(qs.view(2, 6, 8), ks.view(2, 2, 8), vs.view(2, 2, 8), kc, vc, slots, tab, ctx, 0.3)
    assert torch.equal(out, op.decode(q, k, v, kc.clone(), vc.clone(), slots, tab, ctx, 0.3))


def test_a_sequence_alone_and_in_any_batch_or_thread_split_is_bit_identical():
    lens = [700, 1, 333, 2048, 48, 900]      # 2 KV heads: 8,060 token-heads, split over threads
    q, k, v, kc, vc, slots, tab, ctx, _ = _case(lens, nb=1100, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        out = torch.empty(q.shape)
        assert op._native(q, k, v, kc, vc, slots, tab, ctx, 0.125, out) == 2
        alone = torch.empty(1, *q.shape[1:])           # 2,048 tokens alone: 2 threads too
        assert op._native(q[3:4], k[3:4], v[3:4], kc, vc, slots[3:4], tab[3:4], ctx[3:4], 0.125,
                          alone) == 2
        assert torch.equal(alone[0], out[3])
        torch.set_num_threads(1)
        for b in (0, 3, 5):
            alone = op.decode(q[b:b + 1], k[b:b + 1], v[b:b + 1], kc, vc, slots[b:b + 1],
                              tab[b:b + 1, :-(-lens[b] // 4)], ctx[b:b + 1], 0.125)
            assert torch.equal(alone[0], out[b])
        assert torch.equal(op.decode(q.flip(0), k.flip(0), v.flip(0), kc, vc, slots.flip(0),
                                     tab.flip(0), ctx.flip(0), 0.125), out.flip(0))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("bad, message", [
    ({"slots": torch.tensor([0, 64 * 4])}, "slot 256 of row 1 is outside the cache's 256 slots"),
    ({"slots": torch.tensor([-2, 3])}, "slot -2 of row 0 is outside"),
    ({"ctx": torch.tensor([2, 0])}, r"ctx 0 of row 1 is not in \[1, 16\]"),
    ({"ctx": torch.tensor([2, 17])}, r"ctx 17 of row 1 is not in \[1, 16\]"),
    ({"tab": torch.tensor([[0, 1, 2, 3], [64, 1, 2, 3]], dtype=torch.int32)},
     r"block 64 at tables\[1, 0\] is outside the cache's 64 blocks"),
    ({"k": torch.zeros(3, 2, 8)}, "must have the same batch 2"),
    ({"q": torch.zeros(2, 5, 8)}, "H a multiple of 2"),
    ({"v": torch.zeros(2, 2, 8, dtype=torch.float64)}, "v must be float32"),
])
def test_bad_input_is_named_and_nothing_is_written(bad, message):
    q, k, v, kc, vc, slots, tab, ctx, _ = _case([2, 9], nb=64, width_pad=1)
    args = {"q": q, "k": k, "v": v, "slots": slots, "tab": tab, "ctx": ctx} | bad
    before = kc.clone()
    with pytest.raises(ValueError, match=message):
        op.decode(args["q"], args["k"], args["v"], kc, vc, args["slots"], args["tab"], args["ctx"], 0.3)
    assert torch.equal(kc, before)


def test_the_torch_fallback_agrees_and_serves_other_dtypes():
    q, k, v, kc, vc, slots, tab, ctx, tables = _case([1, 6, 21])
    kc2, vc2 = kc.clone(), vc.clone()
    native = op.decode(q, k, v, kc, vc, slots, tab, ctx, 0.3)
    fallback = op.torch_decode(q, k, v, kc2, vc2, slots, tab, ctx, 0.3)
    assert torch.equal(kc, kc2) and (native - fallback).abs().max().item() < 2e-6
    kd, vd = kc.double(), vc.double()
    assert not op.native_for(q.double(), kd)
    got = op.paged_decode(q.double(), k.double(), v.double(), kd, vd, slots, tab, ctx, 0.3)
    assert got.dtype == torch.float64
    assert (got - _reference(q, kc, vc, tables, [1, 6, 21], 0.3)).abs().max().item() < 1e-12


def test_the_op_inside_a_fullgraph_compile_with_a_dynamic_batch():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("inductor")

    def step(q, k, v, kc, vc, slots, tab, ctx):
        return op.paged_decode(q * 2.0, k, v, kc, vc, slots, tab, ctx, 0.25) + 1.0

    f = torch.compile(step, backend=cnt, fullgraph=True)
    for lens in ([3, 9], [1, 5, 17], [2, 4, 6, 8, 30]):
        q, k, v, kc, vc, slots, tab, ctx, _ = _case(lens, seed=len(lens))
        for t in (q, k, v, slots, tab, ctx):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(tab, 1)      # the table width too
        kc2, vc2 = kc.clone(), vc.clone()
        with torch.inference_mode():
            got = f(q, k, v, kc, vc, slots, tab, ctx)
        want = op.decode(q * 2.0, k, v, kc2, vc2, slots, tab, ctx, 0.25) + 1.0
        assert torch.equal(got, want) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert cnt.frame_count == 1       # one graph for every batch size and width

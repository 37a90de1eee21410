"""``torch.ops.warmpath.paged_decode`` over float16 caches (``--kv-dtype float16``): rows written
rounded as ``Tensor.half()`` rounds them, bit for bit (ties, subnormals, overflow), read back
exactly, so the output equals the float32 kernel's over the same (half-representable) values."""

import pytest
import torch

from warmpath.models import paged_decode_op as op
from tests.models.test_paged_decode_op import _case, _reference


def _halved(case):
    """The case with its caches stored as float16 (and their float32 twins holding the same values)."""
    q, k, v, kc, vc, slots, tab, ctx, tables = case
    kh, vh = kc.half(), vc.half()
    return q, k, v, kh, vh, kh.float(), vh.float(), slots, tab, ctx, tables


def test_rows_are_written_rounded_to_nearest_even_as_torch_rounds_them():
    # one KV head, D = 16: ties at both parities, subnormals and their ties, the overflow edge
    # (65519.99 rounds down to 65504, 65520 up to inf), signed zero and values that are exact
    vals = torch.tensor([1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 2 ** -24 * 0.5, 2 ** -24 * 1.5,
                         2 ** -25 * 0.99, 5.96e-8, 6.1e-5, -6.0e-5, 65519.99, 65520.0, -1e6,
                         -0.0, 1.0 / 3.0, -2.7182818, 1024.5, 0.1], dtype=torch.float32)
    assert vals.half().view(torch.int16)[9].item() == 0x7c00      # the case really is an overflow
    kc = torch.zeros(2, 2, 1, 16, dtype=torch.float16)
    vc = torch.zeros(2, 2, 1, 16, dtype=torch.float16)
    k, v = vals.view(1, 1, 16), (-vals).view(1, 1, 16)
    op.decode(torch.zeros(1, 1, 16), k, v, kc, vc, torch.tensor([3]),
              torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([1]), 1.0)
    assert torch.equal(kc[1, 1, 0].view(torch.int16), vals.half().view(torch.int16))
    assert torch.equal(vc[1, 1, 0].view(torch.int16), (-vals).half().view(torch.int16))
    assert torch.count_nonzero(kc[0].view(torch.int16)) == 0       # nothing else written


def test_random_rows_round_bit_for_bit_over_many_magnitudes():
    gen = torch.Generator().manual_seed(5)
    vals = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-30, 17, (4096,), generator=gen).float())
    kc = torch.zeros(64, 4, 4, 16, dtype=torch.float16)
    vc = torch.zeros_like(kc)
    k = vals.view(64, 4, 16)
    slots = torch.arange(64) * 4 + 3                         # each row's own block, offset 3
    op.decode(torch.zeros(64, 4, 16), k, k, kc, vc, slots, torch.arange(64).view(64, 1),
              torch.full((64,), 4), 1.0)
    assert torch.equal(kc[:, 3].view(torch.int16), k.half().view(torch.int16))


@pytest.mark.parametrize("d", [8, 64, 67, 128])
def test_half_caches_give_the_float32_kernels_output_over_the_same_values(d):
    lens = [1, 3, 4, 5, 17, 30, 129, 700]
    q, k, v, kh, vh, kf, vf, slots, tab, ctx, tables = _halved(_case(lens, d=d, nb=260, seed=d))
    k, v = k.half().float(), v.half().float()               # this step's rows, representable too
    got = op.decode(q, k, v, kh, vh, slots, tab, ctx, d ** -0.5)
    want = op.decode(q, k, v, kf, vf, slots, tab, ctx, d ** -0.5)
    assert torch.equal(got, want)
    assert torch.equal(kh.float(), kf) and torch.equal(vh.float(), vf)   # the same rows written
    ref = _reference(q, kf, vf, tables, lens, d ** -0.5)
    assert (got.double() - ref).abs().max().item() < 2e-6


def test_half_subnormals_are_read_exactly():
    # every half subnormal (and its negation) as a K/V row value: read back as the exact float
    sub = torch.arange(1, 1024, dtype=torch.int16).view(torch.float16)
    vals = torch.cat([sub, -sub, torch.zeros(2, dtype=torch.float16)])      # 2,048 values
    vh = vals.view(128, 1, 1, 16)
    kh = torch.zeros_like(vh)                                # equal scores: the output is the mean
    q = torch.zeros(1, 1, 16)
    tab = torch.arange(128).view(1, 128)
    out = op.decode(q, torch.zeros(1, 1, 16), torch.zeros(1, 1, 16), kh, vh, torch.tensor([-1]),
                    tab, torch.tensor([128]), 1.0)
    want = vals.float().double().view(128, 16).mean(0)
    assert (out[0, 0].double() - want).abs().max().item() < 1e-12


def test_a_half_sequence_alone_and_in_a_batch_is_bit_identical():
    lens = [700, 1, 333, 2048, 48]
    q, k, v, kh, vh, _, _, _, tab, ctx, _ = _halved(_case(lens, nb=1100, seed=4))
    out = op.decode(q, k, v, kh, vh, torch.full((5,), -1), tab, ctx, 0.125)
    for b in (0, 3):
        alone = op.decode(q[b:b + 1], k[b:b + 1], v[b:b + 1], kh, vh, torch.tensor([-1]),
                          tab[b:b + 1], ctx[b:b + 1], 0.125)
        assert torch.equal(alone[0], out[b])


def test_mixed_cache_dtypes_are_refused_before_anything_is_written():
    q, k, v, kc, vc, slots, tab, ctx, _ = _case([2, 9], nb=64)
    kh = kc.half()
    before = kh.clone()
    with pytest.raises(ValueError, match="of one dtype"):
        op.decode(q, k, v, kh, vc, slots, tab, ctx, 0.3)
    assert torch.equal(kh, before)


def test_the_torch_fallback_agrees_on_half_caches():
    q, k, v, kh, vh, _, _, slots, tab, ctx, _ = _halved(_case([1, 6, 21, 40]))
    kh2, vh2 = kh.clone(), vh.clone()
    native = op.decode(q, k, v, kh, vh, slots, tab, ctx, 0.3)
    fallback = op.torch_decode(q, k, v, kh2, vh2, slots, tab, ctx, 0.3)
    assert torch.equal(kh.view(torch.int16), kh2.view(torch.int16))
    assert (native - fallback).abs().max().item() < 2e-6


def test_the_scratch_path_gives_the_same_bits_as_the_f16c_path():
    """With F16C a float16 row is widened in registers; WARMPATH_PAGED_WIDEN (in a child) keeps
    the former path through the task's scratch: the same floats in the same order."""
    import os
    import subprocess
    import sys
    lens = [1, 5, 17, 129, 700]
    q, k, v, kh, vh, _kf, _vf, slots, tab, ctx, _tables = _halved(_case(lens, d=64, nb=260, seed=3))
    k, v = k.half().float(), v.half().float()
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"paged_half_{os.getpid()}.pt")
    torch.save((q, k, v, kh.clone(), vh.clone(), slots, tab, ctx), path)
    code = ("import sys, torch\nfrom warmpath.models import paged_decode_op as op\n"
            "q, k, v, kh, vh, slots, tab, ctx = torch.load(sys.argv[1])\n"
            "torch.save(op.decode(q, k, v, kh, vh, slots, tab, ctx, 0.125), sys.argv[1])\n")
    try:
        subprocess.run([sys.executable, "-c", code, path], check=True, timeout=120,
                       env={**os.environ, "WARMPATH_PAGED_WIDEN": "1"})
        scratch = torch.load(path)
    finally:
        os.unlink(path)
    assert torch.equal(op.decode(q, k, v, kh, vh, slots, tab, ctx, 0.125), scratch)

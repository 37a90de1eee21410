"""``--quantization int8a8 | int4a8``: grouped weights times int8 activations
(``models/qlinear_a8_op.py``, ``native/qlinear_a8.c``) against hand-worked numbers, the torch
formulation of the same rounding, batch invariance, the portable variant's bits, bad input."""

import os
import subprocess
import sys

import pytest
import torch

from warmpath.models import qlinear_a8_op as a8
from warmpath.models import qlinear_op as op


def test_the_install_step_built_the_kernel():
    assert a8.available(), "warmpath.models._qlinear_a8 is not built: run `pip install -e .`"
    assert a8.variant() in ("avx512vnni", "avx2", "baseline")


def test_activations_round_per_group_of_32_to_127_steps_of_the_largest():
    x = torch.zeros(1, 40)
    x[0, 0], x[0, 1], x[0, 2], x[0, 3] = 127 / 64, 1.0, -1 / 128, 3 / 128   # group 0: step 1/64
    x[0, 33] = -3.0                                  # group 1: step 3 / 127; k 32-39 only
    got = a8.quantize_activations(x)
    # 1.0 = 64 steps; -1/128 = -0.5 step -> 0 and 3/128 = 1.5 steps -> 2 (half to even)
    assert got[0, :4].tolist() == [127 / 64, 1.0, 0.0, 2 / 64]
    assert got[0, 33].item() == pytest.approx(-3.0, abs=1e-6) and got[0, 34].item() == 0.0


@pytest.mark.parametrize("bits", [8, 4])
def test_layout_round_trips(bits):
    w = torch.randn(45, 70, generator=torch.Generator().manual_seed(0))
    q, d, m = op.quantize(w, bits)
    wp, dp, mp = a8.to_panels(q, d, m)
    assert wp.shape == (2, 3, 1024 if bits == 8 else 512) and dp.shape == (2, 3, 32)
    back = a8.from_panels(wp, dp, mp, 45, 70)
    assert torch.equal(back[0], q) and torch.equal(back[1], d)
    assert m is None or torch.equal(back[2], m)


def test_8_bit_block_holds_four_consecutive_k_of_a_column_with_128_added():
    q = torch.zeros(32, 32, dtype=torch.int8)
    q[17, 4:8] = torch.tensor([1, -1, 127, -127], dtype=torch.int8)   # column 17: half 1, lane 1
    wp, _, _ = a8.to_panels(q, torch.ones(32, 1).half(), None)
    blk = wp[0, 0].view(8, 2, 16, 4)                                     # quad, half, column, r
    assert blk[1, 1, 1].tolist() == [129, 127, 255, 1] and blk[0, 0, 0].tolist() == [128] * 4


@pytest.mark.parametrize("bits", [8, 4])
def test_hand_worked_exact_case(bits):
    # activations already on their grid (max 127 -> step 1), weights exact in both formats
    w = torch.tensor([[2.75, -1.0, 0.5], [0.0, 2.75, -1.0]]) if bits == 4 else \
        torch.tensor([[127 / 32, -1.0, 0.5], [0.0, 127 / 128, -0.75]])
    lin = a8.QA8Linear(w, torch.tensor([1.0, -2.0]), bits)
    x = torch.tensor([[127.0, 2.0, -4.0]])
    want = (x.double() @ w.double().t() + torch.tensor([1.0, -2.0]).double()).float()
    # 4 bits: 349.25 - 2 - 2 + 1 = 346.25; 0 + 5.5 + 4 - 2 = 7.5
    # 8 bits: 504.03125 - 2 - 2 + 1 = 501.03125; 0 + 1.984375 + 3 - 2 = 2.984375
    assert lin(x).tolist() == want.tolist()
    assert want.tolist() == ([[346.25, 7.5]] if bits == 4 else [[501.03125, 2.984375]])


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n,k", [(70, 37), (1536, 576), (576, 1536), (5000, 64)])
def test_a_row_computes_the_same_bits_alone_and_in_any_batch(bits, n, k):
    g = torch.Generator().manual_seed(1)
    lin = a8.QA8Linear(torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g), bits)
    x = torch.randn(13, k, generator=g)
    batched = lin(x)
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(13)]), batched)
    assert torch.equal(lin(x[5:11]), batched[5:11])
    torch.set_num_threads(1)
    try:
        assert torch.equal(lin(x), batched)
    finally:
        torch.set_num_threads(2)
    ref = a8.quantize_activations(x).double() @ lin.dequantized().double().t() + lin.bias.double()
    assert (batched.double() - ref).abs().max().item() < 1e-3


@pytest.mark.parametrize("forced", ["baseline", "avx2"])
def test_every_variant_gives_the_same_bits(forced):
    """Integer sums are exact and the float steps are the same fused multiply-adds: the
    portable C code and the AVX2 code (forced by the environment, in a child) match the
    kernel this machine picks (K = 120: a last group of 24, half of it masked)."""
    if forced == "avx2" and a8.variant() == "baseline":
        pytest.skip("this CPU has no AVX2")
    g = torch.Generator().manual_seed(2)
    cases = {bits: (torch.randn(100, 120, generator=g), torch.randn(100, generator=g), torch.randn(5, 120, generator=g))
             for bits in (8, 4)}
    code = ("import sys, torch\nfrom warmpath.models import qlinear_a8_op as a8\n"
            "cases = torch.load(sys.argv[1])\nassert a8.variant() == sys.argv[2], a8.variant()\n"
            "torch.save({b: a8.QA8Linear(w, bb, b)(x) for b, (w, bb, x) in cases.items()}, sys.argv[1])\n")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"qa8_{os.getpid()}.pt")
    torch.save(cases, path)
    try:
        subprocess.run([sys.executable, "-c", code, path, forced], check=True, timeout=120,
                       env={**os.environ, "WARMPATH_QLINEAR_VARIANT": forced})
        portable = torch.load(path)
    finally:
        os.unlink(path)
    for bits, (w, b, x) in cases.items():
        assert torch.equal(portable[bits], a8.QA8Linear(w, b, bits)(x)), bits


def test_bad_input_and_the_registered_op():
    lin = a8.QA8Linear(torch.randn(8, 16), None, 4)
    with pytest.raises(ValueError, match="input has 15 features, the weight takes 16"):
        lin(torch.randn(2, 15))
    x = torch.randn(3, 16)
    assert torch.equal(torch.ops.warmpath.linear_qa8(x, lin.wp, lin.dp, lin.mp, None, 8, 16), lin(x))
    assert torch.allclose(a8.torch_linear(x, lin.wp, lin.dp, lin.mp, None, 8, 16), lin(x), atol=1e-4, rtol=0)
    assert lin(torch.empty(0, 16)).shape == (0, 8)

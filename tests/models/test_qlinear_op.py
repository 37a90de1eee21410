"""``--quantization int8w | int4w``: grouped weight-only linears (``models/qlinear_op.py``, the C
kernel ``native/qlinear.c``) against hand-worked numbers, gguf's own Q8_0 / Q4_1 quantizers,
the panel layout, batch invariance, strided input, bad input and the registered op."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from warmpath.models import qlinear_op as op


def test_the_install_step_built_the_kernel():
    assert op.available(), "warmpath.models._qlinear is not built: run `pip install -e .` (needs a C compiler)"
    assert op.variant() in ("avx512", "avx2", "baseline")


def test_8_bit_groups_scale_by_the_largest_weight_of_each_group_of_32():
    w = torch.zeros(2, 40)                    # two groups: k 0-31 and 32-39 (padded with zeros)
    w[0, 0], w[0, 1], w[0, 33] = 127 / 64, -32 / 64, 1 / 2      # group 0: d = 1/64; group 1: d = 1/254
    q, d, m = op.quantize(w, 8)
    assert m is None and q.dtype == torch.int8 and d.dtype == torch.float16
    assert q[0, :2].tolist() == [127, -32] and q[0, 33].item() == 127
    assert d[0].tolist() == [1 / 64, torch.tensor(0.5 / 127).half().item()]
    assert d[1].tolist() == [0.0, 0.0] and q[1].abs().sum().item() == 0   # an all-zero row stays 0
    assert op.dequantize(q, d, m)[0, :2].tolist() == [127 / 64, -0.5]


def test_4_bit_groups_are_min_plus_a_fifteenth_of_the_range():
    w = torch.tensor([[-1.0, 2.0, 0.0, 1.0] + [0.0] * 28])   # min -1, max 2: d = 0.2, m = -1
    q, d, m = op.quantize(w, 4)
    assert q.dtype == torch.uint8 and d.tolist() == [[torch.tensor(0.2).half().item()]]
    assert m.tolist() == [[-1.0]]
    assert q[0, :4].tolist() == [0, 15, 5, 10]
    with pytest.raises(ValueError, match="bits must be 8 or 4, got 3"):
        op.quantize(w, 3)


@pytest.mark.parametrize("bits,qtype", [(8, GGMLQuantizationType.Q8_0), (4, GGMLQuantizationType.Q4_1)])
def test_weights_from_gguf_quantizers_come_back_bit_for_bit(bits, qtype):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((96, 160)) * 0.05).astype(np.float32)
    ref = torch.from_numpy(gguf_dequantize(gguf_quantize(w, qtype), qtype).astype(np.float32))
    q, d, m = op.quantize(ref, bits)
    assert torch.equal(op.dequantize(q, d, m), ref)
    lin = op.QLinear(ref, None, bits)
    assert torch.equal(lin.dequantized(), ref)


@pytest.mark.parametrize("bits", [8, 4])
def test_panels_round_trip_and_pad_with_zero_columns(bits):
    w = torch.randn(33, 70, generator=torch.Generator().manual_seed(0))
    q, d, m = op.quantize(w, bits)
    qp, dp, mp = op.to_panels(q, d, m)
    assert qp.shape == (2, 70, 32 if bits == 8 else 16) and dp.shape == (2, 3, 32)
    if bits == 8:                             # columns 33-63: lanes 1-31 of panel 1
        assert qp[1, :, 1:].abs().sum().item() == 0
    else:                                     # byte j: column 32 + j low, 48 + j high
        assert (qp[1, :, 1:] & 15).sum().item() == 0 and (qp[1] >> 4).sum().item() == 0
    back = op.from_panels(qp, dp, mp, 33)
    assert torch.equal(back[0], q) and torch.equal(back[1], d)
    assert (back[2] is None) == (bits == 8) and (m is None or torch.equal(back[2], m))


def test_4_bit_byte_holds_column_j_low_and_column_j_plus_16_high():
    q = torch.zeros(32, 1, dtype=torch.uint8)
    q[3, 0], q[19, 0] = 7, 12
    qp, _, _ = op.to_panels(q, torch.ones(32, 1).half(), torch.zeros(32, 1).half())
    assert qp[0, 0, 3].item() == 7 | (12 << 4)


def test_hand_worked_8_bit_linear_with_bias():
    # row 0: max |w| = 127/32 -> d = 1/32; row 1: max |w| = 127/128 -> d = 1/128: every weight exact
    w = torch.tensor([[127 / 32, -1.0, 0.5], [0.0, 127 / 128, -0.75]])
    lin = op.QLinear(w, torch.tensor([1.0, -2.0]), 8)
    assert torch.equal(lin.dequantized(), w)
    x = torch.tensor([[1.0, 2.0, 4.0], [-4.0, 0.0, 8.0]])
    # row 0: 3.96875 - 2 + 2 + 1 = 4.96875; 0 + 1.984375 - 3 - 2 = -3.015625
    # row 1: -15.875 + 0 + 4 + 1 = -10.875; 0 + 0 - 6 - 2 = -8
    assert lin(x).tolist() == [[4.96875, -3.015625], [-10.875, -8.0]]


def test_hand_worked_4_bit_linear_with_bias():
    # each row (and its zero padding) spans [-1, 2.75]: d = 3.75 / 15 = 0.25, m = -1, exact
    w = torch.tensor([[2.75, -1.0, 0.5], [0.0, 2.75, -1.0]])
    lin = op.QLinear(w, torch.tensor([1.0, -2.0]), 4)
    assert torch.equal(lin.dequantized(), w)
    x = torch.tensor([[1.0, 2.0, 4.0], [-4.0, 0.0, 8.0]])
    # row 0: 2.75 - 2 + 2 + 1 = 3.75; 0 + 5.5 - 4 - 2 = -0.5
    # row 1: -11 + 0 + 4 + 1 = -6; 0 + 0 - 8 - 2 = -10
    assert lin(x).tolist() == [[3.75, -0.5], [-6.0, -10.0]]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n,k", [(70, 37), (1536, 576), (576, 1536), (5000, 64)])
def test_a_row_computes_the_same_bits_alone_and_in_any_batch(bits, n, k):
    g = torch.Generator().manual_seed(1)
    lin = op.QLinear(torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g), bits)
    x = torch.randn(13, k, generator=g)
    batched = lin(x)
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(13)]), batched)
    assert torch.equal(lin(x[5:11]), batched[5:11])           # rows at other tile offsets
    torch.set_num_threads(1)
    try:                                                      # one thread or the team: same bits
        assert torch.equal(lin(x), batched)
    finally:
        torch.set_num_threads(2)
    ref = x.double() @ lin.dequantized().double().t() + lin.bias.double()
    assert (batched.double() - ref).abs().max().item() < 1e-4


def test_strided_3d_and_empty_inputs():
    lin = op.QLinear(torch.randn(40, 24, generator=torch.Generator().manual_seed(3)), None, 4)
    wide = torch.randn(5, 50, generator=torch.Generator().manual_seed(4))
    x = wide[:, 10:34]                                        # row stride 50, not 24
    assert torch.equal(lin(x), lin(x.contiguous()))
    x3 = torch.randn(2, 3, 24, generator=torch.Generator().manual_seed(5))
    assert torch.equal(lin(x3).reshape(6, 40), lin(x3.reshape(6, 24)))
    assert lin(torch.empty(0, 24)).shape == (0, 40)


def test_wrong_feature_count_is_a_clear_error():
    lin = op.QLinear(torch.randn(8, 16), None, 8)
    with pytest.raises(ValueError, match="input has 15 features, the weight takes 16"):
        lin(torch.randn(2, 15))


def test_the_registered_op_and_the_torch_formulation_agree_with_the_kernel():
    g = torch.Generator().manual_seed(6)
    lin = op.QLinear(torch.randn(64, 96, generator=g), torch.randn(64, generator=g), 4)
    x = torch.randn(4, 96, generator=g)
    assert torch.equal(torch.ops.warmpath.linear_q(x, lin.qp, lin.dp, lin.mp, lin.bias, 64), lin(x))
    assert torch.allclose(op.torch_linear(x, lin.qp, lin.dp, lin.mp, lin.bias, 64), lin(x), atol=1e-4, rtol=0)
    meta = torch.ops.warmpath.linear_q(x.to("meta"), lin.qp.to("meta"), lin.dp.to("meta"), None, None, 64)
    assert meta.shape == (4, 64) and meta.device.type == "meta"

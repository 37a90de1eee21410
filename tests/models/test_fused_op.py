"""``models/fused_op.py``: a layer's residual add + RMSNorm and SiLU × up in one C call each
(``native/fused.c``), as the int8-activation modes run them: hand-worked values, torch's formula
within a few float32 ulps, the same bits alone, batched and on every CPU variant, the torch path
where C does not apply, bad shapes, and a model whose fused forward is its plain forward."""

import os
import subprocess
import sys

import pytest
import torch

from warmpath.models import fused_op


def torch_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def test_the_install_step_built_it():
    assert fused_op.available(), "warmpath.models._fused is not built: run `pip install -e .`"
    assert fused_op.variant() in ("avx512", "avx2", "baseline")


@pytest.mark.parametrize("d", [4, 12])          # 12: one 8-lane vector and a tail of 4
def test_hand_worked_add_then_norm(d):
    # x = 1 + h = 1 -> every x 2, mean(x^2) = 4, 1 / sqrt(4) = 0.5: out = w * (2 * 0.5) = w
    x, h = torch.ones(1, d), torch.ones(1, d)
    w = torch.arange(1.0, d + 1)
    out = fused_op.add_rmsnorm(x, h, w, 0.0)
    assert x.tolist() == [[2.0] * d]                 # the residual added in place
    assert out.tolist() == [w.tolist()]


def test_without_a_residual_x_is_left_alone():
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]])          # mean(x^2) = 25 / 4, 1 / sqrt = 0.4
    out = fused_op.add_rmsnorm(x, None, torch.ones(4), 0.0)
    assert x.tolist() == [[3.0, 4.0, 0.0, 0.0]]
    assert out[0].tolist() == pytest.approx([1.2, 1.6, 0.0, 0.0], abs=1e-7)


def test_hand_worked_silu_times_up():
    # silu(0) = 0; silu(g) -> g for large g, -> -0 for very negative g; silu(1) = 1 / (1 + 1/e)
    gu = torch.tensor([[0.0, 50.0, -200.0, 1.0, 2.0, 3.0, 4.0, 5.0]])
    got = fused_op.silu_mul(gu, 4)[0].tolist()
    assert got[0] == 0.0 and got[1] == pytest.approx(150.0, rel=1e-7)
    assert abs(got[2]) < 1e-30 and got[3] == pytest.approx(5 / (1 + 1 / torch.e), rel=2e-7)


@pytest.mark.parametrize("t,d", [(1, 576), (7, 37), (300, 576)])   # 300 rows: the OpenMP team's path
def test_within_a_few_ulps_of_torch_and_the_same_bits_alone_or_batched(t, d):
    g = torch.Generator().manual_seed(t)
    x, h, w = torch.randn(t, d, generator=g) * 4, torch.randn(t, d, generator=g), torch.randn(d, generator=g)
    ref_x = x + h
    x1 = x.clone()
    out = fused_op.add_rmsnorm(x1, h, w, 1e-5)
    assert torch.equal(x1, ref_x)                               # the add is exact
    torch.testing.assert_close(out, torch_norm(ref_x, w, 1e-5), rtol=4e-7, atol=1e-6)
    for r in (0, t - 1):
        alone = fused_op.add_rmsnorm(x[r:r + 1].clone(), h[r:r + 1].clone(), w, 1e-5)
        assert torch.equal(alone, out[r:r + 1])
    gu = torch.randn(t, 2 * d, generator=g) * 6
    act = fused_op.silu_mul(gu, d)
    gate, up = gu.split(d, dim=-1)
    torch.testing.assert_close(act, torch.nn.functional.silu(gate) * up, rtol=4e-7, atol=1e-7)
    assert torch.equal(fused_op.silu_mul(gu[t - 1:].clone(), d), act[t - 1:])


@pytest.mark.parametrize("forced", ["avx2", "baseline"])
def test_every_variant_gives_the_same_bits(forced, tmp_path):
    g = torch.Generator().manual_seed(5)
    x, h, w, gu = torch.randn(9, 44, generator=g), torch.randn(9, 44, generator=g), torch.randn(44, generator=g), \
        torch.randn(9, 86, generator=g) * 5
    here = (fused_op.add_rmsnorm(x.clone(), h, w, 1e-6), fused_op.silu_mul(gu, 43))
    path = tmp_path / "io.pt"
    torch.save({"x": x, "h": h, "w": w, "gu": gu}, path)
    code = ("import sys, torch\nfrom warmpath.models import fused_op as f\n"
            "d = torch.load(sys.argv[1]); assert f.variant() == sys.argv[2], f.variant()\n"
            "torch.save((f.add_rmsnorm(d['x'].clone(), d['h'], d['w'], 1e-6), f.silu_mul(d['gu'], 43)), sys.argv[1])")
    cpu = open("/proc/cpuinfo").read()
    if forced == "avx2" and " avx2" not in cpu:
        pytest.skip("this CPU has no AVX2")
    subprocess.run([sys.executable, "-c", code, str(path), forced], check=True, timeout=120,
                   env={**os.environ, "WARMPATH_QLINEAR_VARIANT": forced})
    there = torch.load(path)
    assert torch.equal(here[0], there[0]) and torch.equal(here[1], there[1])


def test_the_torch_path_where_c_does_not_apply():
    x = torch.randn(4, 6, dtype=torch.float64)
    h = torch.randn(4, 6, dtype=torch.float64)
    w = torch.randn(6, dtype=torch.float64)
    ref_x = x + h
    out = fused_op.add_rmsnorm(x, h, w, 1e-5)       # float64: torch computes it, x += h still
    assert torch.equal(x, ref_x) and torch.equal(out, torch_norm(ref_x, w, 1e-5))
    gu = torch.randn(8, 3).t()                       # not unit-stride rows
    gate, up = gu.split(4, dim=-1)
    assert torch.equal(fused_op.silu_mul(gu, 4), torch.nn.functional.silu(gate) * up)


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match=r"residual \[1, 3\] does not match \[1, 4\]"):
        fused_op.add_rmsnorm(torch.ones(1, 4), torch.ones(1, 3), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match=r"norm weight \[3\] does not match rows of 4"):
        fused_op.add_rmsnorm(torch.ones(1, 4), None, torch.ones(3), 1e-5)
    with pytest.raises(ValueError, match=r"gate\|up rows have 6 values, expected 2 x 4"):
        fused_op.silu_mul(torch.ones(2, 6), 4)


def test_an_int8_activation_model_runs_fused_and_agrees_with_its_plain_forward():
    from warmpath.models.loader import load_model, quantized

    loaded = quantized(load_model("tiny", seed=0), "int4a8")
    m = loaded.model
    assert m.fused
    ids = list(range(3, 40))
    with torch.inference_mode():
        fused = m.prefill_once(ids)
        m.fused = False
        try:
            plain = m.prefill_once(ids)
        finally:
            m.fused = True
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    assert not quantized(load_model("tiny", seed=0), "int4w").model.fused

"""``models/rope_op.py``: queries and keys rotated in one C call (``native/rope.c``), bit for bit
``RotaryEmbedding.apply``; a hand-worked pair; where it declines; bad shapes."""

import math

import pytest
import torch

from warmpath.models import rope_op
from warmpath.models.llama import RotaryEmbedding


def test_the_install_step_built_it():
    assert rope_op.available(), "warmpath.models._rope is not built: run `pip install -e .`"


def test_hand_worked_quarter_turn():
    # D = 2: one pair (a, b) = (1, 2) per head; cos 0, sin 1 -> (a·0 − b·1, b·0 + a·1) = (−2, 1)
    qkv = torch.tensor([[1.0, 2.0, 3.0, 4.0, 9.0, 9.0]])     # q head, k head, v (ignored)
    cos, sin = torch.zeros(1, 1, 1), torch.ones(1, 1, 1)
    q, k = rope_op.rope_qk(qkv, cos, sin, 1, 1, 2)
    assert q.tolist() == [[[-2.0, 1.0]]] and k.tolist() == [[[-4.0, 3.0]]]


@pytest.mark.parametrize("t,h,kvh,dh", [(1, 9, 3, 64), (7, 4, 2, 8), (33, 9, 3, 64)])
def test_bit_for_bit_the_torch_formulation(t, h, kvh, dh):
    g = torch.Generator().manual_seed(t)
    qkv = torch.randn(t, (h + 2 * kvh) * dh, generator=g) * 3        # v's columns follow
    rope = RotaryEmbedding.__new__(RotaryEmbedding)
    ang = torch.rand(t, dh // 2, generator=g) * 2 * math.pi * 100
    cos, sin = ang.cos().unsqueeze(1), ang.sin().unsqueeze(1)
    q, k = rope_op.rope_qk(qkv, cos, sin, h, kvh, dh)
    qs, ks, _ = qkv.split([h * dh, kvh * dh, kvh * dh], dim=-1)
    assert torch.equal(q, rope.apply(qs.view(t, h, dh), cos, sin))
    assert torch.equal(k, rope.apply(ks.view(t, kvh, dh), cos, sin))


def test_declines_what_it_does_not_compute():
    cos, sin = torch.ones(2, 1, 2), torch.zeros(2, 1, 2)
    assert rope_op.rope_qk(torch.ones(2, 8, dtype=torch.float64), cos, sin, 1, 1, 4) is None
    assert rope_op.rope_qk(torch.ones(8, 2).t(), cos, sin, 1, 1, 4) is None      # column stride 2


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match=r"cos and sin must hold \[2, 2\] values"):
        rope_op.rope_qk(torch.ones(2, 8), torch.ones(3, 1, 2), torch.ones(3, 1, 2), 1, 1, 4)

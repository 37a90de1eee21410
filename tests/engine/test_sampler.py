import pytest
import torch

from warmpath.engine.sampler import Sampler
from warmpath.engine.sequence import SamplingParams


def logits(seed=0, n=1, v=50):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g) * 3


def test_greedy_is_argmax():
    lg = logits(n=3)
    out, errors = Sampler(torch.device("cpu")).sample(lg, ["a", "b", "c"], [SamplingParams(temperature=0)] * 3)
    assert out == lg.argmax(-1).tolist() and errors == {}


def test_top_k_1_and_tiny_top_p_equal_greedy():
    lg = logits(1)
    s = Sampler(torch.device("cpu"))
    want = int(lg.argmax())
    assert s.sample(lg, ["a"], [SamplingParams(temperature=1.5, top_k=1)]) == ([want], {})
    assert s.sample(lg, ["b"], [SamplingParams(temperature=1.5, top_p=1e-6)]) == ([want], {})
    # below float32's smallest subnormal top_p compares as 0: the likeliest token must stay (was a
    # NaN distribution and a 500, found by the schema fuzzer)
    for i, tiny in enumerate((1e-46, 1e-300, 5e-324)):
        assert s.sample(lg, [f"t{i}"], [SamplingParams(temperature=1.0, top_p=tiny)]) == ([want], {})


def test_top_k_restricts_support():
    lg = logits(2)
    top3 = set(torch.topk(lg[0], 3).indices.tolist())
    s = Sampler(torch.device("cpu"))
    got = {s.sample(lg, [f"r{i}"], [SamplingParams(temperature=2.0, top_k=3, seed=i)])[0][0] for i in range(60)}
    assert got <= top3 and len(got) > 1


def test_seed_reproducible_and_independent_of_batch():
    lg = logits(3, n=2)
    p = SamplingParams(temperature=1.0, seed=42)
    a = Sampler(torch.device("cpu"))
    b = Sampler(torch.device("cpu"))
    seq_a = [a.sample(lg[:1], ["x"], [p])[0][0] for _ in range(10)]
    batch = torch.stack([lg[1], lg[0]])
    seq_b = [b.sample(batch, ["y", "x"], [SamplingParams(temperature=1.0, seed=7), p])[0][1] for _ in range(10)]
    assert seq_a == seq_b
    c = Sampler(torch.device("cpu"))
    assert [c.sample(lg[:1], ["x"], [SamplingParams(temperature=1.0, seed=43)])[0][0] for _ in range(10)] != seq_a


def test_a_failing_row_fails_that_request_alone():
    """A row whose sampling raises is reported for its request; its batch mates are sampled
    exactly as without it (their generators are untouched)."""
    lg = logits(4, n=3)
    s = Sampler(torch.device("cpu"))
    s.fail_seeds.add(99)
    good = SamplingParams(temperature=1.0, seed=5)
    toks, errors = s.sample(lg, ["a", "bad", "c"], [good, SamplingParams(temperature=1.0, seed=99),
                                                   SamplingParams(temperature=0)])
    assert list(errors) == ["bad"] and "injected sampler fault (seed 99)" in errors["bad"]
    assert toks[1] == int(lg[1].argmax()) and toks[2] == int(lg[2].argmax())
    alone, _ = Sampler(torch.device("cpu")).sample(lg[:1], ["a"], [good])
    assert toks[0] == alone[0]


def test_a_tiny_temperature_samples_the_argmax_instead_of_failing():
    lg = logits(5, n=1)
    toks, errors = Sampler(torch.device("cpu")).sample(lg, ["t"], [SamplingParams(temperature=1e-300, seed=1)])
    assert errors == {} and toks == [int(lg[0].argmax())]


@pytest.mark.parametrize("kw,msg", [({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
                                    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"),
                                    ({"stop": ("",)}, "stop"), ({"seed": 2**80}, "seed"),
                                    ({"seed": -(2**63) - 1}, "seed"), ({"temperature": float("nan")}, "temperature")])
def test_params_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw)

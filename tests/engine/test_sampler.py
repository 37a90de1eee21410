import pytest
import torch

from warmpath.engine.sampler import Sampler, distribution, penalize_
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
                                    ({"seed": -(2**63) - 1}, "seed"), ({"temperature": float("nan")}, "temperature"),
                                    ({"min_p": -0.1}, "min_p"), ({"min_p": 1.5}, "min_p"),
                                    ({"min_p": float("nan")}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty"),
                                    ({"repetition_penalty": -1}, "repetition_penalty"),
                                    ({"repetition_penalty": 5e-324}, "repetition_penalty"),
                                    ({"repetition_penalty": 10.5}, "repetition_penalty"),
                                    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
                                    ({"repetition_penalty": float("nan")}, "repetition_penalty")])
def test_params_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw)


LN = torch.tensor([4.0, 2.0, 1.0, 1.0]).log()   # softmax at temperature 1: [1/2, 1/4, 1/8, 1/8]


def test_min_p_keeps_tokens_at_least_min_p_times_the_likeliest():
    # min_p 0.4: the bar is 0.4 × 1/2 = 0.2, so 1/4 stays and the two 1/8 go: [2/3, 1/3, 0, 0]
    got = distribution(LN, SamplingParams(temperature=1.0, min_p=0.4))
    assert torch.allclose(got, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]), atol=1e-6)
    # min_p 0.6: the bar is 0.3, only the likeliest token is left
    assert distribution(LN, SamplingParams(temperature=1.0, min_p=0.6)).tolist() == [1.0, 0.0, 0.0, 0.0]
    # min_p applies after the temperature: at 0.5 the probabilities are ∝ [16, 4, 1, 1], so the
    # ratios to the max are [1, 1/4, 1/16, 1/16]; min_p 0.05 keeps all, 0.1 drops the 1/16s
    got = distribution(LN, SamplingParams(temperature=0.5, min_p=0.05))
    assert torch.allclose(got, torch.tensor([16 / 22, 4 / 22, 1 / 22, 1 / 22]), atol=1e-6)
    got = distribution(LN, SamplingParams(temperature=0.5, min_p=0.1))
    assert torch.allclose(got, torch.tensor([0.8, 0.2, 0.0, 0.0]), atol=1e-6)
    assert distribution(LN, SamplingParams(temperature=0.5, min_p=0.3)).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_min_p_after_top_k_and_top_p():
    # top_k 2 keeps ∝ [4, 2] → [2/3, 1/3]; min_p 0.4 then keeps both (1/3 ≥ 0.4 × 2/3), 0.6 not
    got = distribution(LN, SamplingParams(temperature=1.0, top_k=2, min_p=0.4))
    assert torch.allclose(got, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]), atol=1e-6)
    assert distribution(LN, SamplingParams(temperature=1.0, top_k=2, min_p=0.6)).tolist() == [1.0, 0.0, 0.0, 0.0]
    # top_p 0.6: 1/2 < 0.6, so the second token is needed too; min_p 0.6 then drops it
    got = distribution(LN, SamplingParams(temperature=1.0, top_p=0.6, min_p=0.6))
    assert got.tolist() == [1.0, 0.0, 0.0, 0.0]


def one_row(row: torch.Tensor, ids: list[int], penalty: float) -> torch.Tensor:
    return penalize_(row.clone().unsqueeze(0), torch.zeros(len(ids), dtype=torch.long), torch.tensor(ids), penalty)[0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_once():
    row = torch.tensor([3.0, 2.0, -1.0, 0.5])
    # tokens 0 (three times in the history) and 2 seen: counted once each
    seen = Sampler(torch.device("cpu")).seen("r", ([0, 2, 0], [0]))
    assert seen.tolist() == [0, 2]
    assert one_row(row, seen.tolist(), 2.0).tolist() == [1.5, 2.0, -2.0, 0.5]     # 3/2, -1×2
    # a penalty below 1 rewards repetition: 3/0.5 = 6, -1×0.5 = -0.5
    assert one_row(row, [0, 2], 0.5).tolist() == [6.0, 2.0, -0.5, 0.5]


def test_the_seen_tokens_grow_with_the_output_and_are_forgotten_on_release():
    s = Sampler(torch.device("cpu"))
    prompt, output = [1, 1], []
    assert s.seen("r", (prompt, output)).tolist() == [1]
    output += [3]
    assert s.seen("r", (prompt, output)).tolist() == [1, 3]
    output += [4, 3, 1]
    assert s.seen("r", (prompt, output)).tolist() == [1, 3, 4]
    assert s._seen["r"][0] == 6
    s.release("r")
    assert s.seen("r", ([0], [])).tolist() == [0]


def test_greedy_with_a_repetition_penalty_takes_the_argmax_of_the_penalized_logits():
    lg = torch.tensor([[3.0, 2.0, -1.0, 0.5]] * 3)
    s = Sampler(torch.device("cpu"))
    toks, errors = s.sample(lg, ["plain", "penalized", "mild"],
                            [SamplingParams(temperature=0), SamplingParams(temperature=0, repetition_penalty=2.0),
                             SamplingParams(temperature=0, repetition_penalty=1.4)],
                            [None, ([0], [3]), ([0, 0], [])])
    # plain: token 0 (3.0); penalized by 2: [1.5, 2.0, -1.0, 0.25] → 1; by 1.4: 3/1.4 ≈ 2.14 > 2 → 0
    assert toks == [0, 1, 0] and errors == {}
    want = torch.tensor([[3.0, 2.0, -1.0, 0.5], [1.5, 2.0, -1.0, 0.25], [3 / 1.4, 2.0, -1.0, 0.5]])
    assert torch.allclose(lg, want)   # penalized in place (the step's own logits)


def test_sampling_with_a_repetition_penalty_samples_the_penalized_distribution():
    # [ln 4, ln 2, ln 1, ln 1] with token 0 penalized by 2: ln 4 / 2 = ln 2 → ∝ [2, 2, 1, 1];
    # top_k 2 keeps tokens 0 and 1 alone, each with 1/2: both are sampled, nothing else
    lg = LN.unsqueeze(0)
    s = Sampler(torch.device("cpu"))
    p = SamplingParams(temperature=1.0, top_k=2, repetition_penalty=2.0)
    assert torch.allclose(distribution(one_row(LN, [0], 2.0), p), torch.tensor([0.5, 0.5, 0.0, 0.0]), atol=1e-6)
    got = {s.sample(lg, [f"r{i}"], [SamplingParams(**{**vars(p), "seed": i})], [([0], [])])[0][0] for i in range(40)}
    assert got == {0, 1}


def test_seeded_min_p_and_penalty_are_reproducible_and_independent_of_the_batch():
    lg = logits(6, n=2)
    p = SamplingParams(temperature=1.0, min_p=0.05, repetition_penalty=1.3, seed=11)
    hist = ([5, 9, 5], [17])
    a = [Sampler(torch.device("cpu")).sample(lg[:1], ["x"], [p], [hist])[0][0] for _ in range(3)]
    batch = torch.stack([lg[1], lg[0]])
    b = Sampler(torch.device("cpu")).sample(batch, ["y", "x"], [SamplingParams(temperature=0.7, seed=2), p],
                                            [None, hist])[0][1]
    assert a == [a[0]] * 3 and b == a[0]

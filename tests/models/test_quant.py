"""Quantized linear layers (models/quant.py): mode rules, exact small cases, the real model."""

import pytest
import torch

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.sequence import SamplingParams
from warmpath.models.loader import load_model
from warmpath.models.llama import Linear
from warmpath.models.qlinear_a8_op import QA8Linear
from warmpath.models.qlinear_op import QLinear
from warmpath.models.quant import Fp16Linear, Int8Linear, resolve_mode

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,",
           "The three laws of thermodynamics are", "import numpy as np\n",
           "Q: What is 17*23?\nA:", "The quick brown fox", "In machine learning, overfitting"]


@pytest.fixture(scope="module")
def fp32_greedy(smollm):
    """The float32 reference's greedy answers (32 tokens) to ``PROMPTS``, in one batch: what
    each slow test below compares with (computed once; the same engine, prompts and
    parameters in each)."""
    tok = smollm.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    return LLMEngine(EngineConfig(num_blocks=256), loaded=smollm).generate(
        prompts, SamplingParams(max_tokens=32, temperature=0))


def test_auto_means_fp16_weights_on_cpu_and_the_reference_elsewhere():
    assert resolve_mode("auto", torch.device("cpu")) == "fp16w"
    assert resolve_mode("auto", torch.device("cuda")) == "none"
    assert resolve_mode("int8", torch.device("cpu")) == "int8"
    with pytest.raises(ValueError, match="CPU kernels; use none on cuda"):
        resolve_mode("fp16w", torch.device("cuda"))
    with pytest.raises(ValueError, match="got 'int4'"):
        resolve_mode("int4", torch.device("cpu"))


def test_fp16_linear_is_exact_for_fp16_representable_weights():
    w = torch.tensor([[0.5, -1.25, 2.0], [0.0, 0.75, -0.125]])      # [out 2, in 3]
    b = torch.tensor([1.0, -2.0])
    x = torch.tensor([[1.0, 2.0, 3.0], [-4.0, 0.0, 8.0]])
    # row 0: 0.5 - 2.5 + 6 + 1 = 5; 0 + 1.5 - 0.375 - 2 = -0.875
    # row 1: -2 + 0 + 16 + 1 = 15; 0 + 0 - 1 - 2 = -3
    assert Fp16Linear(w, b)(x).tolist() == [[5.0, -0.875], [15.0, -3.0]]


def test_int8_linear_smooths_an_outlier_channel():
    """One input channel 100x larger than the rest: smoothing keeps the small channels."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g) * 0.05
    x = torch.randn(8, 32, generator=g)
    x[:, 3] *= 100.0
    ref = x @ w.t()
    smoothed = Int8Linear(w, None, x.abs().amax(dim=0))(x)
    plain = Int8Linear(w, None, x.abs().amax(dim=0), alpha=0.0)(x)   # s = 1/amax_w: no smoothing of x
    err = lambda y: ((y - ref).norm() / ref.norm()).item()  # noqa: E731
    assert err(smoothed) < 0.02
    assert err(smoothed) < err(plain)


@pytest.mark.slow
def test_fp16w_logits_and_greedy_answers_match_the_reference(smollm, fp32_greedy):
    q = load_model("smollm2", quantization="fp16w")
    assert q.revision == smollm.revision + "+fp16w"       # never shares KV with fp32 workers
    params = sum(p.numel() for p in q.model.parameters())
    cfg = q.config
    # only the embedding table and the RMSNorm weights stay float32 parameters
    assert params == cfg.vocab_size * cfg.hidden_size + (2 * cfg.num_layers + 1) * cfg.hidden_size
    tok = smollm.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    sp = SamplingParams(max_tokens=32, temperature=0)
    eng = LLMEngine(EngineConfig(num_blocks=256), loaded=q)
    ours = eng.generate(prompts, sp)
    assert ours == fp32_greedy
    eng.add_request(prompts[0], SamplingParams(max_tokens=1, temperature=0), "r")
    out = eng.scheduler.schedule()
    logits = eng.runner.execute(out, return_logits=True).logits[0]
    ref_eng = LLMEngine(EngineConfig(num_blocks=64), loaded=smollm)
    ref_eng.add_request(prompts[0], SamplingParams(max_tokens=1, temperature=0), "r")
    ref_logits = ref_eng.runner.execute(ref_eng.scheduler.schedule(), return_logits=True).logits[0]
    assert (logits - ref_logits).abs().max().item() < 0.05   # measured 0.019 on a 300-token prompt


@pytest.mark.slow
def test_int4w_computes_with_the_gguf_files_own_weights_bit_for_bit(smollm, fp32_greedy):
    """The default SmolLM2 file is Q4_1 (linears) with a Q8_0 embedding: int4w's groups hold
    exactly those weights, so greedy answers are the float32 reference's."""
    q = load_model("smollm2", quantization="int4w")
    assert q.revision == smollm.revision + "+int4w"
    ref = dict(smollm.model.named_modules())
    layers = [(n, m) for n, m in q.model.named_modules() if isinstance(m, QLinear) and n != "lm_head"]
    assert len(layers) == 4 * smollm.config.num_layers                 # qkv, o, gate-up, down
    for name, mod in layers:
        assert mod.bits == 4 and torch.equal(mod.dequantized(), ref[name].weight_t.t()), name
    assert q.model.lm_head.bits == 8
    assert torch.equal(q.model.lm_head.dequantized(), smollm.model.embed_tokens.weight)
    tok = smollm.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    sp = SamplingParams(max_tokens=32, temperature=0)
    assert LLMEngine(EngineConfig(num_blocks=256), loaded=q).generate(prompts, sp) == fp32_greedy


@pytest.mark.slow
def test_int4a8_is_batch_invariant_and_near_the_reference(smollm, fp32_greedy):
    q = load_model("smollm2", quantization="int4a8")
    assert q.revision == smollm.revision + "+int4a8"
    assert all(isinstance(m, QA8Linear) for m in q.model.modules() if isinstance(m, (QLinear, Linear)))
    tok = smollm.tokenizer
    prompts = [tok.encode(p) for p in PROMPTS]
    sp = SamplingParams(max_tokens=24, temperature=0)
    batched = LLMEngine(EngineConfig(num_blocks=256), loaded=q).generate(prompts, sp)
    alone = [LLMEngine(EngineConfig(num_blocks=64), loaded=q).generate([p], sp)[0] for p in prompts]
    assert batched == alone
    # the activations' rounding moves logits (measured max 1.6 over a 1,500-token text, 96% top-1
    # agreement): the first greedy token agrees on every prompt here (the reference's first
    # token: its batch's first step, the same whatever max_tokens)
    assert [o[0] for o in batched] == [o[0] for o in fp32_greedy]

"""Our model vs the transformers reference, on the real SmolLM2 GGUF and on HF directories."""

import subprocess
import sys

import pytest
import torch

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.sequence import SamplingParams
from warmpath.models.loader import load_model, smollm2_gguf_path

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_ref():
    """transformers' own model and tokenizer of the SmolLM2 GGUF. transformers parses the file
    anew for the config, the weights and the tokenizer (a pure-Python walk over its 49k-entry
    vocabulary each time) and builds gguf's tensor-name table once per submodule: the same
    reads, each done once here (their results are the same objects transformers would rebuild)."""
    import functools

    import gguf

    p = smollm2_gguf_path()
    readers = {}

    def reader(path, *args, **kw):
        key = (str(path), args, tuple(sorted(kw.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kw)
        return readers[key]

    real_reader = gguf.GGUFReader
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                                  dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return model.eval(), tok


def test_logits_match_transformers_prefill_and_20_decode_steps(smollm, hf_ref):
    ref, _ = hf_ref
    text = "In a distant galaxy, engineers built a cache for every thought. " * 40
    prompt = smollm.tokenizer.encode(text)[:300]
    assert len(prompt) == 300
    eng = LLMEngine(EngineConfig(num_blocks=64), loaded=smollm)
    eng.add_request(prompt, SamplingParams(max_tokens=21, temperature=0, ignore_eos=True), "r")
    ours, tokens = [], []
    while eng.has_work():
        out = eng.scheduler.schedule()
        res = eng.runner.execute(out, return_logits=True)
        eng.scheduler.update(out, res.sampled, eng.eos_ids)
        ours.append(res.logits[0])
        tokens.append(res.sampled["r"])
    assert len(ours) == 21  # prefill + 20 decode steps
    with torch.no_grad():
        full = ref(torch.tensor([prompt + tokens[:-1]])).logits[0, 299:]
    diff = (torch.stack(ours) - full).abs().max().item()
    assert diff <= 1e-3, diff


def test_repetition_penalty_matches_transformers_greedy(smollm, hf_ref):
    """Greedy with repetition_penalty 1.3 (prompt + output tokens, HF semantics) gives
    transformers' tokens."""
    ref, _ = hf_ref
    msgs = [{"role": "user", "content": "Name three colours."}]
    prompt = smollm.tokenizer.encode(smollm.tokenizer.apply_chat_template(msgs), add_special=False)
    eng = LLMEngine(EngineConfig(num_blocks=64), loaded=smollm)
    ours = eng.generate([prompt], SamplingParams(max_tokens=32, temperature=0, repetition_penalty=1.3))[0]
    with torch.no_grad():
        theirs = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              do_sample=False, repetition_penalty=1.3, max_new_tokens=32, eos_token_id=2)
    assert ours == theirs[0, len(prompt):].tolist() and len(ours) > 8


def test_tokenizer_and_chat_template_match_transformers(smollm, hf_ref):
    _, tok = hf_ref
    for s in ["Hello world 12345 it's  a test\n\n  éà 漢字", "<|im_start|>user\nhi<|im_end|>", "  x=1;\ty"]:
        assert smollm.tokenizer.encode(s) == tok.encode(s, add_special_tokens=False)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert smollm.tokenizer.apply_chat_template(msgs) == tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True)


def _tiny_hf(arch: str, tmp_path, **extra):
    cfg_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mistral": transformers.MistralConfig}[arch]
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "mistral": transformers.MistralForCausalLM}[arch]
    cfg = cfg_cls(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=2, **extra)
    torch.manual_seed(0)
    m = cls(cfg).eval()
    m.save_pretrained(tmp_path)
    return m


@pytest.mark.parametrize("arch,extra", [
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
               "tie_word_embeddings": False}),
    ("qwen2", {"tie_word_embeddings": True}),
    ("mistral", {"tie_word_embeddings": False}),
])
def test_hf_directory_models_match_transformers(arch, extra, tmp_path):
    ref = _tiny_hf(arch, tmp_path, **extra)
    lm = load_model(str(tmp_path))
    assert lm.config.architecture == arch
    eng = LLMEngine(EngineConfig(num_blocks=64), loaded=lm)
    prompt = list(range(3, 203))
    eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0), "r")
    out = eng.scheduler.schedule()
    res = eng.runner.execute(out, return_logits=True)
    with torch.no_grad():
        want = ref(torch.tensor([prompt])).logits[0, -1]
    assert (res.logits[0] - want).abs().max().item() <= 1e-4


@pytest.mark.parametrize("content,needle", [(None, "not found"), (b"GGUFgarbage" * 10, "not a readable GGUF")])
def test_cli_names_missing_or_corrupt_model_file(tmp_path, content, needle):
    path = tmp_path / "broken.gguf"
    if content is not None:
        path.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "warmpath.cli", "prepare", "--model", str(path)],
                       capture_output=True, text=True, env={"WARMPATH_CACHE": str(tmp_path / "c"), "PATH": ""})
    assert r.returncode == 2
    assert str(path) in r.stderr and needle in r.stderr

"""Engine throughput vs HF transformers on the same weights and threads (one run, one process).

Prints and writes JSON: prefill tokens/s at several prompt lengths, decode tokens/s at
several batch sizes, the machine's fp32 matmul GFLOP/s and copy bandwidth, and the
ratios the engine issue sets as goals. ``--modes none,fp16w,int8`` also compares the
quantization modes (models/quant.py): decode and prefill speed, the share of the
memory-bandwidth roofline their weight bytes allow, and greedy agreement with ``none``.

    .venv/bin/python -m benchmarks.engine.engine [--out benchmarks/results/engine.json]
    .venv/bin/python -m benchmarks.engine.engine --modes none,fp16w,int8 --prefill 2048 --batches 1,16
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.models.loader import load_model, smollm2_gguf_path


def matmul_gflops(n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e9


def copy_gbps(mib: int = 512, reps: int = 5) -> float:
    src = torch.ones(mib * (1 << 20) // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return 2 * src.numel() * 4 * reps / (time.perf_counter() - t) / 1e9  # read + write


def prefill_flops(cfg, n_params_nonembed: int, t: int) -> float:
    """Model FLOPs of a causal prefill of t tokens, without the LM head."""
    attn = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * t * t  # QK^T + PV, causal half
    return 2 * n_params_nonembed * t + attn


def ours_prefill(lm, t: int, reps: int) -> float:
    eng = LLMEngine(EngineConfig(num_blocks=t // 16 + 8, enable_prefix_caching=False,
                                 scheduler=SchedulerConfig(max_num_batched_tokens=t,
                                                           enable_chunked_prefill=False)), loaded=lm)
    prompt = [(i * 7919) % 40000 + 100 for i in range(t)]
    best = float("inf")
    for _ in range(reps):
        eng.add_request(prompt, SamplingParams(max_tokens=1, temperature=0))
        t0 = time.perf_counter()
        eng.step()
        best = min(best, time.perf_counter() - t0)
    return t / best


def hf_prefill(ref, t: int, reps: int) -> float:
    ids = torch.tensor([[(i * 7919) % 40000 + 100 for i in range(t)]])
    best = float("inf")
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            ref(ids, use_cache=False)
            best = min(best, time.perf_counter() - t0)
    return t / best


def ours_decode(lm, batch: int, new: int, prompt_len: int = 32) -> float:
    eng = LLMEngine(EngineConfig(num_blocks=batch * ((prompt_len + new) // 16 + 2),
                                 scheduler=SchedulerConfig(max_num_seqs=batch,
                                                           max_num_batched_tokens=batch * prompt_len)),
                    loaded=lm)
    p = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    for b in range(batch):
        eng.add_request([100 + b] + [(i * 31 + b) % 40000 + 50 for i in range(prompt_len - 1)], p)
    eng.step()  # all prefills in one step (first token each)
    t0 = time.perf_counter()
    n = 0
    while eng.has_work():
        n += len(eng.step())
    return n / (time.perf_counter() - t0)


def hf_generate(ref, batch: int, new: int, prompt_len: int = 32) -> float:
    ids = torch.tensor([[100 + b] + [(i * 31 + b) % 40000 + 50 for i in range(prompt_len - 1)]
                        for b in range(batch)])
    with torch.no_grad():
        t0 = time.perf_counter()
        ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                     do_sample=False, pad_token_id=2)
    return batch * new / (time.perf_counter() - t0)


AGREEMENT_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,",
                     "The three laws of thermodynamics are", "import numpy as np\n",
                     "Q: What is 17*23?\nA:", "The quick brown fox", "In machine learning, overfitting"]
WEIGHT_BYTES = {"none": 4, "fp16w": 2, "int8": 1}     # per weight; the grouped modes: weight_bytes()


def weight_bytes(lm, mode: str, linear: int) -> float:
    """Bytes of every linear weight (head included): the grouped modes' buffers as held
    (4- or 8-bit weights, half scales and offsets), else ``linear`` × the mode's width."""
    from warmpath.models.qlinear_a8_op import QA8Linear
    from warmpath.models.qlinear_op import QLinear

    if mode in WEIGHT_BYTES:
        return linear * WEIGHT_BYTES[mode]
    mods = [m for m in lm.model.modules() if isinstance(m, (QLinear, QA8Linear))]
    return sum(b.numel() * b.element_size() for m in mods for n, b in m.named_buffers() if n != "bias")


def greedy_answers(lm, n: int = 32) -> list[list[int]]:
    tok = lm.tokenizer
    eng = LLMEngine(EngineConfig(num_blocks=256), loaded=lm)
    return eng.generate([tok.encode(p) for p in AGREEMENT_PROMPTS],
                        SamplingParams(max_tokens=n, temperature=0))


def compare_modes(a, copy: float) -> dict:
    """Per mode: prefill and decode tok/s, roofline share at batch 1, greedy agreement."""
    out, ref = {}, None
    for mode in a.modes.split(","):
        lm = load_model("smollm2", quantization=mode)
        cfg = lm.config
        # bytes a batch-1 decode step must read: every linear weight (head included) once
        linear = cfg.num_layers * cfg.hidden_size * (cfg.num_heads * cfg.head_dim
                                                     + 2 * cfg.num_kv_heads * cfg.head_dim
                                                     + cfg.num_heads * cfg.head_dim
                                                     + 3 * cfg.intermediate_size) + cfg.vocab_size * cfg.hidden_size
        answers = greedy_answers(lm)
        ref = ref or answers
        row = {"prefill_tok_s": {t: round(ours_prefill(lm, int(t), 2), 1) for t in a.prefill.split(",")},
               "decode_tok_s": {b: round(ours_decode(lm, int(b), a.new_tokens), 1) for b in a.batches.split(",")},
               "greedy_equal_to_none": f"{sum(x == y for x, y in zip(answers, ref))}/{len(ref)}"}
        roof = copy / 2 * 1e9 / weight_bytes(lm, mode, linear)   # copy_gbps counts read + write
        row["decode_b1_roofline_tok_s"] = round(roof, 1)
        if "1" in row["decode_tok_s"]:
            row["decode_b1_share_of_roofline"] = round(row["decode_tok_s"]["1"] / roof, 3)
        out[mode] = row
        print(f"{mode:>6}: prefill {row['prefill_tok_s']} tok/s, decode {row['decode_tok_s']} tok/s, "
              f"b1 roofline {roof:.0f} tok/s, greedy equal to none {row['greedy_equal_to_none']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", default="512,2048,8191")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hf-max-prefill", type=int, default=8191, help="skip HF prefill above this")
    ap.add_argument("--modes", default=None, help="compare quantization modes, e.g. none,fp16w,int8")
    ap.add_argument("--out", default="benchmarks/results/engine.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.modes:
        res = {"copy_gbps": round(copy_gbps(), 2), "threads": a.threads}
        res["modes"] = compare_modes(a, res["copy_gbps"])
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))
        print(f"wrote {a.out}")
        return
    import transformers

    lm = load_model("smollm2")
    path = smollm2_gguf_path()
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = lm.config
    nonembed = sum(p.numel() for n, p in lm.model.named_parameters() if "embed_tokens" not in n)
    res = {"machine": {"threads": a.threads, "cpu": platform.processor() or platform.machine(),
                       "torch": torch.__version__, "transformers": transformers.__version__,
                       "matmul_gflops": round(matmul_gflops(), 1), "copy_gbps": round(copy_gbps(), 2)},
           "prefill": {}, "decode": {}}
    print(f"fp32 matmul {res['machine']['matmul_gflops']} GFLOP/s, copy {res['machine']['copy_gbps']} GB/s")
    for t in [int(x) for x in a.prefill.split(",")]:
        reps = 3 if t <= 2048 else 1
        ours = ours_prefill(lm, t, reps)
        hf = hf_prefill(ref, t, reps) if t <= a.hf_max_prefill else None
        gflops = prefill_flops(cfg, nonembed, t) * ours / t / 1e9
        row = {"ours_tok_s": round(ours, 1), "hf_eager_tok_s": round(hf, 1) if hf else None,
               "ratio": round(ours / hf, 2) if hf else None, "ours_gflops": round(gflops, 1),
               "fraction_of_matmul_peak": round(gflops / res["machine"]["matmul_gflops"], 3)}
        res["prefill"][t] = row
        print(f"prefill {t:>5}: ours {row['ours_tok_s']} tok/s, HF eager {row['hf_eager_tok_s']} tok/s, "
              f"x{row['ratio']}, {row['ours_gflops']} GFLOP/s = {row['fraction_of_matmul_peak']:.0%} of matmul peak")
    for b in [int(x) for x in a.batches.split(",")]:
        ours = ours_decode(lm, b, a.new_tokens)
        hf = hf_generate(ref, b, a.new_tokens) if b <= 16 else None
        row = {"ours_tok_s": round(ours, 1), "hf_generate_tok_s": round(hf, 1) if hf else None,
               "ratio": round(ours / hf, 2) if hf else None}
        res["decode"][b] = row
        print(f"decode batch {b:>3}: ours {row['ours_tok_s']} tok/s, HF generate {row['hf_generate_tok_s']} tok/s, x{row['ratio']}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

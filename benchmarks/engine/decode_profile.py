"""Where a decode step's time goes (one process, real SmolLM2, torch.profiler).

Runs ``--steps`` greedy decode steps of ``--batch`` sequences through the engine and splits the
mean step wall time into the self CPU time of the operators, grouped (the linears, attention,
the KV cache's scatter/gather, elementwise and norms, sampling), and the rest: Python,
the engine's bookkeeping and operator dispatch. Compared with the memory-bandwidth roofline
of the weight bytes, it says whether decode is bound by bandwidth or by overhead.

    .venv/bin/python -m benchmarks.engine.decode_profile --modes none,fp16w,int8

``--attention gather`` runs the former attention (copies each sequence's blocks every layer),
``--compile on`` the compiled decode step (its start-up compile time is reported).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.scheduler import SchedulerConfig
from warmpath.engine.sequence import SamplingParams
from warmpath.models.loader import load_model

GROUPS = [  # (group, substrings of operator names), first match wins
    # --compile on: inductor's graphs (norms, RoPE, attention, residuals fused; not split further)
    ("compiled graphs", ("compiledfxgraph", "torch-compiled region", "dynamo")),
    ("linear", ("linear", "addmm", "aten::mm", "matmul", "aten::bmm")),
    ("attention", ("scaled_dot_product", "_flash_attention", "softmax", "paged_decode")),
    ("kv scatter/gather", ("index_copy", "index", "gather", "flatten", "copy_")),
    ("embedding", ("embedding",)),
    ("sampling", ("argmax", "topk", "sort", "multinomial")),
]


def group_of(name: str) -> str:
    """The group an operator's time is counted in."""
    low = name.lower()
    for g, keys in GROUPS:
        if any(k in low for k in keys):
            return g
    return "elementwise, norms, views"


def profile_mode(mode: str, steps: int, context: int, batch: int = 1, attention: str = "paged",
                 compile: str = "off", kv_dtype: str = "auto") -> dict:
    """Mean step wall and self CPU time per group over ``steps`` decode steps of ``batch``."""
    lm = load_model("smollm2", quantization=mode)
    t0 = time.perf_counter()
    eng = LLMEngine(EngineConfig(num_blocks=batch * ((context + 2 * steps + 16) // 16 + 2),
                                 scheduler=SchedulerConfig(max_num_seqs=batch,
                                                           max_num_batched_tokens=batch * context),
                                 attention=attention, compile=compile, kv_dtype=kv_dtype),
                    loaded=lm)
    start_s = time.perf_counter() - t0
    for b in range(batch):
        prompt = [100 + b] + [(i * 31 + b) % 40000 + 50 for i in range(context - 1)]
        eng.add_request(prompt, SamplingParams(max_tokens=2 * steps + 16, temperature=0, ignore_eos=True))
    for _ in range(8):                       # prefill + warm-up decode steps
        eng.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    plain = (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        profiled = (time.perf_counter() - t0) / steps
    by = defaultdict(float)
    for ev in prof.key_averages():
        by[group_of(ev.key)] += ev.self_cpu_time_total / 1e6 / steps
    ops = sum(by.values())
    return {"attention": attention, "compile": compile, "kv_dtype": str(eng.runner.kv_dtype),
            "engine_start_s": round(start_s, 2),
            "compile_s": round(eng.runner.compile_seconds, 2), "step_ms": round(plain * 1e3, 2),
            "profiled_step_ms": round(profiled * 1e3, 2),
            "ops_ms": {g: round(v * 1e3, 2) for g, v in sorted(by.items(), key=lambda kv: -kv[1])},
            "ops_total_ms": round(ops * 1e3, 2),
            "outside_ops_ms": round((profiled - ops) * 1e3, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="fp16w")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", default="paged", choices=("paged", "gather"))
    ap.add_argument("--compile", default="off", choices=("off", "on"))
    ap.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "float16"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_profile.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    res = {m: profile_mode(m, a.steps, a.context, a.batch, a.attention, a.compile, a.kv_dtype)
           for m in a.modes.split(",")}
    for m, r in res.items():
        print(f"{m:>6} ({a.attention}, compile {a.compile}, KV {r['kv_dtype']}, start-up compile {r['compile_s']} s): "
              f"step {r['step_ms']} ms (profiled {r['profiled_step_ms']}), operators "
              f"{r['ops_total_ms']} ms {r['ops_ms']}, outside operators {r['outside_ops_ms']} ms")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"settings": vars(a) | {"out": str(a.out)}, "modes": res}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

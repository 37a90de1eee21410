"""The flags that name what a simulated worker is, one definition for ``sim``, ``plan`` and ``bench
--sim``: the GPU, the model (bundled or any ``config.json``), precisions, the engine whose
scheduler defaults it takes (``sim/engine_defaults.py``), and what the router knows of its step
times at start (``sim/router_start.py``)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from warmpath.sim.engine_defaults import ENGINES, EngineDefaults, calibrated_engine, engine_defaults
from warmpath.sim.hardware import HARDWARE, HardwareProfile
from warmpath.sim.model_profile import MODELS, ModelProfile, model_profile
from warmpath.sim.router_start import ROUTER_STEPS

# --kv-dtype: as the workers' flag (auto: the model's own), plus fp8 (vLLM's --kv-cache-dtype fp8)
KV_DTYPE_BYTES = {"auto": 0, "float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def add_profile_args(p: argparse.ArgumentParser, hardware: str, cpu: bool) -> None:
    """``--hardware`` (default ``hardware``; ``cpu`` among the choices when ``cpu``), ``--model``,
    ``--weights``, ``--kv-dtype``, ``--engine``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
    ``--gpu-memory-utilization``, ``--router-steps``."""
    p.add_argument("--hardware", default=hardware, choices=(*HARDWARE, *(("cpu",) if cpu else ())),
                   help="the GPU (spec sheet + fitted fractions: docs/benchmarks/sim_gpu.md)")
    p.add_argument("--model", default="llama-3.1-8b",
                   help=f"a bundled model ({', '.join(MODELS)}) or a Hugging Face config.json (or its folder)")
    p.add_argument("--weights", default=None, choices=("bf16", "fp16", "fp8"),
                   help="the weights' precision (default: the config's; fp8: GEMMs at the FP8 peak)")
    p.add_argument("--kv-dtype", default="auto", choices=tuple(KV_DTYPE_BYTES),
                   help="as the workers' --kv-dtype: the KV bytes of every block, load and handoff (auto: the model's)")
    p.add_argument("--engine", default="vllm", choices=ENGINES,
                   help="whose scheduler defaults a GPU worker takes on that GPU (sim/engine_defaults.py)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="running sequences per worker (default: the engine's)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step, the prefill chunk (default: the engine's; --hardware cpu: the calibration's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="share of each GPU's memory for weights and KV (default: the engine's)")
    p.add_argument("--router-steps", default="auto", choices=ROUTER_STEPS,
                   help="what the router knows of step times at start: learn (nothing; it learns from the answers), "
                        "calibration (a calibration of that hardware), oracle (each worker's exact steps: diagnosis "
                        "only); auto: calibration for --hardware cpu, else learn")


def model_from_args(a: argparse.Namespace) -> ModelProfile:
    """``--model`` in ``--weights`` and ``--kv-dtype``."""
    m = model_profile(a.model)
    if getattr(a, "weights", None):
        m = m.with_precision(a.weights)
    kv = KV_DTYPE_BYTES[getattr(a, "kv_dtype", "auto")]
    return replace(m, kv_dtype_bytes=kv) if kv else m


def engine_from_args(a: argparse.Namespace, hw: HardwareProfile, base: dict | None = None) -> EngineDefaults:
    """The engine's defaults on ``hw`` (``base``: a calibration's served engine instead, the CPU
    profile's), with the flags that override them."""
    d = calibrated_engine(base) if base is not None else engine_defaults(getattr(a, "engine", "vllm"), hw)
    seqs, tokens = getattr(a, "max_num_seqs", None), getattr(a, "max_num_batched_tokens", None)
    util = getattr(a, "gpu_memory_utilization", None)
    for flag, v in (("--max-num-seqs", seqs), ("--max-num-batched-tokens", tokens)):
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v}")
    return EngineDefaults(d.engine, seqs or d.max_num_seqs, tokens or d.max_num_batched_tokens,
                          d.enable_chunked_prefill, d.order, util if util is not None else d.gpu_memory_utilization)

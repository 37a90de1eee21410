"""The serving engine's scheduler as users run it, per GPU (pure data).

A simulated GPU worker schedules with the limits its engine would pick on that GPU unless told
otherwise: how many sequences run at once, how many tokens one step computes, whether prompts
are chunked (and beside decodes) or run whole before the decodes, and how much of the GPU's
memory the KV cache may take. Sources and the quoted code: ``warmpath/sim/models/SOURCES.md``.

* ``vllm`` — vLLM V1 (0.32, the version ``warmpath worker --engine vllm`` pins) as ``vllm serve``
  starts: 1,024 sequences and 16,384 tokens per step on a GPU of ≥ 160 GiB (B200, MI300X);
  1,024 and 8,192 on one of ≥ 70 GiB that is not an A100 (H100, H200); else 256 and 2,048
  (A100, L40S); chunked prefill beside the decodes; ``gpu_memory_utilization`` 0.92.
* ``vllm-0.6`` — vLLM 0.6 (V0) as its benchmarks ran: 256 sequences, no chunked prefill (a step
  computes whole prompts, up to the context length of tokens, before any decode).
* ``sglang`` — SGLang 0.3–0.4: its chunked prefill of 8,192 tokens (4,096 under 60 GiB), as many
  running requests as the KV cache holds (``max_running_requests`` from memory: 4,096 here),
  ``mem_fraction_static`` 0.88 for a single-GPU worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.engine.scheduler import SchedulerConfig
from warmpath.sim.hardware import HardwareProfile

MAX_MODEL_LEN = 1 << 20   # the simulator's own: traces decide the lengths


@dataclass(frozen=True)
class EngineDefaults:
    """One engine's scheduler limits on one GPU and the share of its memory it uses."""

    engine: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = True
    order: str = "decode-first"
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def scheduler(self, max_model_len: int = MAX_MODEL_LEN) -> SchedulerConfig:
        """The worker's scheduler; without chunking a step takes whole prompts up to the context."""
        tokens = self.max_num_batched_tokens if self.enable_chunked_prefill else max(self.max_num_batched_tokens,
                                                                                      min(max_model_len, 1 << 17))
        return SchedulerConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=tokens,
                               enable_chunked_prefill=self.enable_chunked_prefill, order=self.order,
                               max_model_len=max_model_len)


def _vllm_limits(hw: HardwareProfile) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) of ``vllm serve`` on ``hw``."""
    if hw.hbm_gib >= 160:
        return 1024, 16384
    if hw.hbm_gib >= 70 and not hw.name.startswith("a100"):
        return 1024, 8192
    return 256, 2048


def engine_defaults(engine: str, hw: HardwareProfile) -> EngineDefaults:
    """``engine``'s defaults on ``hw`` (see the module doc)."""
    if engine == "vllm":
        return EngineDefaults("vllm", *_vllm_limits(hw), gpu_memory_utilization=0.92)
    if engine == "vllm-0.6":
        return EngineDefaults("vllm-0.6", 256, 8192, enable_chunked_prefill=False, order="prefill-first")
    if engine == "sglang":
        return EngineDefaults("sglang", 4096, 8192 if hw.hbm_gib >= 60 else 4096, gpu_memory_utilization=0.88)
    raise ValueError(f"engine: one of {', '.join(ENGINES)}, got {engine!r}")


def calibrated_engine(base: dict) -> EngineDefaults:
    """The embedded engine as a calibration served it (``warmpath calibrate``'s ``engine``;
    ``{}``: 256 sequences, 8,192 tokens a step)."""
    return EngineDefaults("calibrated", base.get("max_num_seqs", 256), base.get("max_num_batched_tokens", 8192))


ENGINES = ("vllm", "vllm-0.6", "sglang")

"""Hardware and model profiles for the simulator (pure data, no torch).

GPU numbers are the vendors' dense bf16 peaks; ``mfu`` / ``mbu`` are the fractions of peak
FLOP/s and HBM bandwidth a good engine reaches (defaults from published serving traces:
~50% MFU in prefill, ~70% MBU in decode). ``cpu`` has no roofline: its step times come from
``warmpath calibrate`` (a fitted :class:`~warmpath.engine.step_model.StepModel`, whose
mixed steps are fitted too). The GPU profiles price a mixed step by the roofline over all its
items at once (:class:`~warmpath.sim.step_time.Roofline`): an assumed form, not a measured one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator and the links around it (bytes/s are per GPU)."""

    name: str
    flops: float                  # dense FLOP/s in the serving dtype
    hbm_bytes_s: float
    nvlink_bytes_s: float         # per direction
    nic_bytes_s: float            # RDMA NIC share per GPU (L3 and P→D traffic)
    dram_bytes_s: float           # host DRAM ↔ GPU (L2)
    hbm_gib: float
    mfu: float = 0.5
    mbu: float = 0.7
    step_overhead_s: float = 0.003   # scheduling, launch, sampling per step
    net_latency_s: float = 2e-4      # one RDMA round trip + RPC
    l3_write_bytes_s: float | None = None   # L3 puts, when slower than reads (None: the NIC's)
    l3_write_latency_s: float = 0.0         # extra fixed cost of one put (on top of net_latency_s)

    def __post_init__(self) -> None:
        if min(self.flops, self.hbm_bytes_s, self.nic_bytes_s, self.dram_bytes_s) <= 0:
            raise ValueError(f"hardware {self.name}: speeds must be > 0")
        if not (0 < self.mfu <= 1 and 0 < self.mbu <= 1):
            raise ValueError(f"hardware {self.name}: mfu and mbu must be in (0, 1]")


HARDWARE = {
    "h100": HardwareProfile("h100", 989e12, 3.35e12, 450e9, 50e9, 25e9, 80),
    "b200": HardwareProfile("b200", 2250e12, 8e12, 900e9, 50e9, 50e9, 180),
}
# NIC: 400 Gb/s RDMA per GPU = 50 GB/s. NVLink: 900 GB/s (H100) / 1.8 TB/s (B200) total
# bidirectional, i.e. 450 / 900 GB/s per direction for all-reduce.


@dataclass(frozen=True)
class ModelProfile:
    """Shape of a Llama-family decoder (what the roofline and the KV sizes need)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params: float
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 0               # the KV cache's element bytes (0: the weights' dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * (self.kv_dtype_bytes or self.dtype_bytes)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


MODELS = {
    "llama-3.1-8b": ModelProfile("llama-3.1-8b", 32, 4096, 32, 8, 128, 8.03e9),
    "llama-3.1-70b": ModelProfile("llama-3.1-70b", 80, 8192, 64, 8, 128, 70.6e9),
    "smollm2-135m": ModelProfile("smollm2-135m", 30, 576, 9, 3, 64, 134.5e6, dtype_bytes=4),
}

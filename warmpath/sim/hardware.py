"""GPU profiles for the simulator: spec sheets plus a few fitted fractions (pure data, no torch).

Each GPU's peaks are its vendor's data-sheet figures (``SPECS``: dense, not sparse, BF16 and
FP8 tensor FLOP/s, HBM bandwidth and capacity, NVLink per direction; the NIC and host links
are the usual server's). What an engine reaches of them is a handful of fractions shared by
every GPU (``FIT``: compute and memory efficiency, all-reduce efficiency, the per-step and
per-sequence overheads of scheduling, launches and sampling), fitted once on published
measurements (``benchmarks/sim_accuracy/published.py``, table and residuals in
``docs/benchmarks/sim_accuracy.md``). ``cpu`` has no roofline: its step times come from
``warmpath calibrate`` (a fitted :class:`~warmpath.engine.step_model.StepModel`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from warmpath.sim.model_profile import MODELS, ModelProfile  # noqa: F401  (the simulator's models, by name)


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
    fp8_flops: float = 0.0                  # dense FP8 FLOP/s (0: no FP8 tensor cores: FP8 weights run at ``flops``)
    ar_eff: float = 1.0                     # share of the NVLink bandwidth an all-reduce reaches
    ar_latency_s: float = 8e-6              # fixed cost of one all-reduce (launch, synchronisation)
    fp8_mfu: float = 0.0                    # share of the FP8 peak FP8 GEMMs reach (0: ``mfu``)
    attn_mfu: float = 0.0                   # share of the BF16 peak attention kernels reach (0: ``mfu``)
    seq_overhead_s: float = 0.0             # per sequence in a step (its scheduling, inputs, sampling)

    def __post_init__(self) -> None:
        if min(self.flops, self.hbm_bytes_s, self.nic_bytes_s, self.dram_bytes_s) <= 0:
            raise ValueError(f"hardware {self.name}: speeds must be > 0")
        if not (0 < self.mfu <= 1 and 0 < self.mbu <= 1 and 0 < self.ar_eff <= 1):
            raise ValueError(f"hardware {self.name}: mfu, mbu and ar_eff must be in (0, 1]")
        if min(self.step_overhead_s, self.seq_overhead_s, self.fp8_flops, self.ar_latency_s) < 0 \
                or not (0 <= self.fp8_mfu <= 1 and 0 <= self.attn_mfu <= 1):
            raise ValueError(f"hardware {self.name}: overheads, fp8_flops >= 0 and fp8_mfu in [0, 1]")

    def gemm_flops(self, dtype_bytes: int) -> float:
        """The FLOP/s linear layers reach with weights of ``dtype_bytes``: the FP8 peak times
        ``fp8_mfu`` where the GPU has FP8 tensor cores, else the BF16 peak times ``mfu``."""
        if dtype_bytes == 1 and self.fp8_flops:
            return self.fp8_flops * (self.fp8_mfu or self.mfu)
        return self.flops * self.mfu


TB, GB = 1e12, 1e9
SPECS = {   # data sheets: dense BF16 / FP8 FLOP/s, HBM B/s, NVLink per direction, NIC per GPU, host link, GiB
    "h100": HardwareProfile("h100", 989.4 * TB, 3.35 * TB, 450 * GB, 50 * GB, 25 * GB, 80, fp8_flops=1978.9 * TB),
    "h200": HardwareProfile("h200", 989.4 * TB, 4.8 * TB, 450 * GB, 50 * GB, 25 * GB, 140, fp8_flops=1978.9 * TB),
    "b200": HardwareProfile("b200", 2250 * TB, 7.7 * TB, 900 * GB, 50 * GB, 50 * GB, 180, fp8_flops=4500 * TB),
    "a100-80g": HardwareProfile("a100-80g", 312 * TB, 2.039 * TB, 300 * GB, 25 * GB, 20 * GB, 80),
    "l40s": HardwareProfile("l40s", 362.05 * TB, 0.864 * TB, 32 * GB, 25 * GB, 20 * GB, 45, fp8_flops=733 * TB),
    "mi300x": HardwareProfile("mi300x", 1307.4 * TB, 5.3 * TB, 448 * GB, 50 * GB, 25 * GB, 192, fp8_flops=2614.9 * TB),
}
# NIC: 400 Gb/s RDMA per GPU (200 Gb/s on A100 / L40S servers). NVLink: 900 GB/s (H100/H200),
# 1.8 TB/s (B200), 600 GB/s (A100) total bidirectional, i.e. half per direction for an
# all-reduce; L40S has none (PCIe Gen4 x16); MI300X: 7 Infinity Fabric links, 896 GB/s in all.
# Sources: warmpath/sim/models/SOURCES.md (B200: the shipping 180 GB / 7.7 TB/s, not the launch 192 / 8).

FIT = {"mfu": 0.7, "fp8_mfu": 0.6, "attn_mfu": 0.2, "mbu": 0.6, "ar_eff": 0.6, "ar_latency_s": 8e-6,
       "step_overhead_s": 0.003, "seq_overhead_s": 2e-5}
"""What an engine reaches of the spec sheet, the same for every GPU (fitted: see the module doc)."""
FITTED = frozenset(FIT)


def with_fit(spec: HardwareProfile, fit: dict | None = None) -> HardwareProfile:
    """``spec`` with the fitted fractions (``fit``: others, e.g. while fitting)."""
    return replace(spec, **(FIT if fit is None else {**FIT, **fit}))


def provenance(hw: HardwareProfile) -> dict[str, str]:
    """Each parameter of ``hw`` and where it comes from: ``spec sheet`` or ``fit``."""
    return {f.name: "fit" if f.name in FITTED else "spec sheet" for f in fields(hw)
            if f.name not in ("name", "net_latency_s", "l3_write_bytes_s", "l3_write_latency_s")}


HARDWARE = {k: with_fit(v) for k, v in SPECS.items()}

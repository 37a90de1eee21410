"""The numbers the seeds report, for ``warmpath repro cpd|ppd`` to draw and tabulate beside
their own (pure data, no torch). Every entry names where it comes from; the seeds are
``/work/shared/seeds/`` (000: the CPD blog in Chinese; 001: a write-up of it; 004: the PPD
paper, arXiv 2603.13358, in Chinese). What a seed shows only in a figure or table whose
values its text does not give is left out (``None``), not read off a picture.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SeedValue:
    """One reported value: a point (``lo == hi``) or a range, in ``unit``, with its source."""

    lo: float
    hi: float
    unit: str
    source: str

    def __post_init__(self) -> None:
        if self.lo > self.hi:
            raise ValueError(f"seed value: lo {self.lo} > hi {self.hi} ({self.source})")

    def holds(self, x: float | None, rel_tol: float = 0.0) -> bool | None:
        """Whether ``x`` is within the range widened by ``rel_tol`` of its ends (None: no x)."""
        if x is None:
            return None
        if rel_tol:
            return self.lo - abs(self.lo) * rel_tol <= x <= self.hi + abs(self.hi) * rel_tol
        return self.lo <= x <= self.hi

    def text(self) -> str:
        """``0.75 to 0.8 QPS/GPU``, ``-68%``, ``143.7 ms``, ``> 1 s`` (no upper end)."""
        def f(v):
            return f"{v * 100:+.0f}%" if self.unit == "%" else f"{v:g}"
        if self.hi == float("inf"):
            body = f"> {f(self.lo)}"
        else:
            body = f(self.lo) if self.lo == self.hi else f"{f(self.lo)} to {f(self.hi)}"
        return body if self.unit == "%" else f"{body} {self.unit}"


_B = "CPD blog (seed 000), 'Saturation behaviour' under figure 4; seed 001 §6.2"
CPD = {
    # achieved QPS/GPU where the curve levels off (figure 4, bottom left)
    "plateau_qps_per_gpu": {"2P1D": SeedValue(0.75, 0.8, "QPS/GPU", _B),
                            "CPD-1D": SeedValue(1.1, 1.15, "QPS/GPU", _B + " ('CPD ... about 1.1-1.15')"),
                            "2P2D": None, "CPD-2D": None},   # the blog: 2D delays saturation, no number
    "gain": SeedValue(0.35, 0.40, "%", "CPD blog (seed 000) summary and figure 1: +35-40% sustainable QPS"),
    # 2P1D's TTFT p50 near its saturation (figure 4, top left): "rises past 1 s, into seconds"
    "ttft_p50_near_saturation_s": {"2P1D": SeedValue(1.0, float("inf"), "s",
                                                     "CPD blog (seed 000), 'Latency under load': p50 > 1 s"),
                                   "CPD-1D": SeedValue(0.0, 3.0, "s", "CPD blog (seed 000): 'sub-second to "
                                                       "low-second' median at the baseline's saturating rates")},
}
CPD_SETUP = {"hardware": "B200", "prefill": "TP4 per node", "decode": "DP4 per node", "max_in_flight": 24,
             "ramp_s": 30, "steady_s": 600, "target_qps_per_gpu": (0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6),
             "source": "CPD blog (seed 000) 'Evaluation'; seed 001 §6.1"}

_P = "PPD paper (seed 004)"
PPD = {
    # x=1 vs x=0, turn-2 TTFT, the synthetic grid (Table 1; its cells are not in the seed's text)
    "x1_turn2_ttft_change": SeedValue(-0.73, -0.48, "%", _P + " §4.3 / Table 1: -48% to -73%"),
    "x1_turn2_ttft_change_best_1p3d": SeedValue(-0.733, -0.733, "%", _P + " §4.3: 1P_3D up to 73.3%"),
    # PPD (dynamic) vs PD on real workloads (ShareGPT, WildChat)
    "ppd_turn2_ttft_change_avg": SeedValue(-0.68, -0.68, "%", _P + " §A5 conclusion: about 68% on average"),
    # figure 5: 1P_3D, QPS = 1, WildChat, emulated bandwidth falling (values of the axis not given)
    "fig5_pd_turn2_ttft_ms": SeedValue(143.7, 170.6, "ms", _P + " §6.4 / figure 5: PD 143.7 -> 170.6 ms (+18.7%)"),
    "fig5_ppd_turn2_ttft_ms": SeedValue(51.0, 51.0, "ms", _P + " §6.4 / figure 5: PPD about 51 ms"),
    "fig5_pd_tpot_ms": SeedValue(8.07, 8.38, "ms", _P + " §6.4 / figure 5: PD 8.07 -> 8.38 ms (+3.8%)"),
    "fig5_ppd_tpot_ms": SeedValue(8.1, 8.1, "ms", _P + " §6.4 / figure 5: PPD about 8.1 ms"),
    # Table 3 / figure 11 (27 points: 3 splits x 9 QPS, WildChat); the win counts are not in the text
    "table3_points": 27,
    "fig11_x0_failed_points": 13,
    "table3_success_ppd": SeedValue(1.0, 1.0, "share", _P + " §6.3 / Table 3: PPD 100% success, as x=1"),
}
PPD_SETUP = {"hardware": "4x H100 80GB (NVLink)", "model": "Llama-3.1-8B", "point_s": 10,
             "qps_levels": "10 levels, 0.5-20", "kv_bytes_per_token": 128 * 1024,
             "source": _P + " §4.2, B.6"}

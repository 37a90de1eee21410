"""Load vs recompute: what moving a prefix from a lower tier costs against computing it,
from this worker's own measurements (pure; the engine and the simulator share it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable



@dataclass
class Ema:
    """Exponential moving average with a prior (used until the first sample)."""

    value: float
    alpha: float = 0.3
    samples: int = 0

    def update(self, x: float) -> None:
        self.value = x if self.samples == 0 else (1 - self.alpha) * self.value + self.alpha * x
        self.samples += 1


@dataclass
class TransferFit:
    """``seconds = overhead_s + bytes / bytes_s``, a least-squares line through this
    worker's transfers (sums decayed by ``decay`` per sample, so it follows change). The
    priors hold until samples of two different sizes exist; a fit whose slope is not
    positive is noise and changes nothing; a negative intercept is taken as 0."""

    overhead_s: float
    bytes_s: float
    decay: float = 0.98
    samples: int = 0
    sums: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)   # weight, Σx, Σy, Σx², Σxy
    fitted: bool = False                                  # a line was determined at least once

    def update(self, nbytes: float, seconds: float) -> None:
        n, sx, sy, sxx, sxy = (v * self.decay for v in self.sums)
        x, y = float(nbytes), float(seconds)
        n, sx, sy, sxx, sxy = self.sums = (n + 1, sx + x, sy + y, sxx + x * x, sxy + x * y)
        self.samples += 1
        var = n * sxx - sx * sx
        if var <= 1e-9 * n * sxx:     # one size so far: the line is not determined
            return
        slope = (n * sxy - sx * sy) / var
        if slope <= 0:
            return
        self.bytes_s = 1.0 / slope
        self.overhead_s = max(0.0, (sy - slope * sx) / n)
        self.fitted = True

    def seconds(self, nbytes: float) -> float:
        return self.overhead_s + nbytes / self.bytes_s


@dataclass
class RateFit:
    """Bytes per second of one kind of transfer, Σ bytes / Σ seconds over its samples (sums
    decayed by ``decay`` per sample): the large transfers weigh most, so the few-block ones,
    mostly fixed cost, do not drag it down; robust where the sizes cluster and a line through
    them (:class:`TransferFit`) would be noise."""

    decay: float = 0.9
    samples: int = 0
    sums: tuple[float, float] = (0.0, 0.0)   # Σ bytes, Σ seconds

    def update(self, nbytes: float, seconds: float) -> None:
        if nbytes <= 0 or seconds <= 0:
            return
        b, s = (v * self.decay for v in self.sums)
        self.sums = (b + nbytes, s + seconds)
        self.samples += 1

    @property
    def bytes_s(self) -> float | None:
        """The rate (``None`` before a sample)."""
        return self.sums[0] / self.sums[1] if self.samples else None


@dataclass
class LoadCostModel:
    """Loading ``n`` blocks costs ``overhead + bytes / bandwidth`` (a line fitted per tier
    to this worker's transfers); recomputing costs ``tokens / prefill speed`` (a moving
    average of its prefill steps).

    ``mode``: ``auto`` (cheaper wins), ``always`` (load) or ``never`` (recompute).
    """

    mode: str = "auto"
    transfer: dict[str, TransferFit] = field(default_factory=lambda: {
        "L2": TransferFit(1e-4, 4e9), "L3": TransferFit(2e-3, 4e8)})   # priors
    prefill_tok_s: Ema = field(default_factory=lambda: Ema(500.0))
    decisions: dict[str, int] = field(default_factory=lambda: {"load": 0, "recompute": 0})

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "always", "never"):
            raise ValueError(f"load mode must be auto, always or never, got {self.mode!r}")

    def load_seconds(self, tier: str, nbytes: int) -> float:
        return self.transfer[tier].seconds(nbytes)

    def recompute_seconds(self, tokens: int) -> float:
        return tokens / self.prefill_tok_s.value

    def should_load(self, tier: str, num_blocks: int, block_bytes: int, block_size: int) -> bool:
        """Decide and count the decision."""
        if num_blocks <= 0:
            return False
        if self.mode == "auto":
            load = self.load_seconds(tier, num_blocks * block_bytes) < \
                self.recompute_seconds(num_blocks * block_size)
        else:
            load = self.mode == "always"
        self.decisions["load" if load else "recompute"] += 1
        return load

    def choose_loads(self, hashes: list, count_l2: Callable[[list], int], count_l3: Callable[[list], int] | None,
                     block_bytes: int, block_size: int) -> tuple[int, int]:
        """Blocks of ``hashes`` (those after the L1 hits) to load from L2, then from L3:
        the leading run each tier holds, kept only where loading beats recomputing."""
        if not hashes:
            return 0, 0
        n2 = count_l2(hashes)
        if n2 and not self.should_load("L2", n2, block_bytes, block_size):
            return 0, 0  # recomputing beats even host memory: L3 would be slower still
        n3 = count_l3(hashes[n2:]) if count_l3 is not None and n2 < len(hashes) else 0
        if n3 and not self.should_load("L3", n3, block_bytes, block_size):
            n3 = 0
        return n2, n3

    def observe_transfer(self, tier: str, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.transfer[tier].update(nbytes, seconds)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= 64 and seconds > 0:
            self.prefill_tok_s.update(tokens / seconds)

"""What the simulated router knows of the workers' step times when it starts (pure).

The real router prices steps with a calibration (``warmpath router --calibration``: a
:class:`~warmpath.engine.step_model.StepModel` fitted on timed steps) or with nothing: then
with the lines it learns from the answers' timings and the prefill replies. The simulated one
starts the same way and learns through the same code (``routing/ledger.py``):

* ``learn`` — nothing; the GPU profiles' default (a vLLM fleet reports its answers' timings);
* ``calibration`` — a calibration of that hardware: a CPU profile's own (the file the real
  router is given), or for a GPU the :class:`StepModel` that ``warmpath calibrate``'s grid of
  timed steps fits on the simulated GPU (:func:`calibration_of`); the CPU profiles' default;
* ``oracle`` — every worker's exact step function (diagnosis only: no reported figure uses it).
"""

from __future__ import annotations

from warmpath.engine.step_model import StepModel, StepProfile

ROUTER_STEPS = ("auto", "learn", "calibration", "oracle")
PREFILL_TOKENS = (512, 1024, 2048, 4096, 8192)
CONTEXTS = (0, 512, 2048, 8192)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def calibration_of(step) -> StepModel:
    """The :class:`StepModel` fitted on ``step``'s times over ``warmpath calibrate``'s kind of
    grid: prefills of 512–8K tokens over 0–8K of context, decode batches 1–256 and mixed steps."""
    prof = StepProfile()
    for t in PREFILL_TOKENS:
        for c in CONTEXTS:
            prof.prefill.append((t, c, step.step_s([(t, c)])))
    for b in BATCHES:
        for c in CONTEXTS[1:]:
            prof.decode.append((b, c, step.step_s([(1, c)] * b)))
            for t in (256, 2048):
                prof.mixed.append((b, c, t, 0, step.step_s([(1, c)] * b + [(t, 0)])))
    return prof.fit(min_rows=len(CONTEXTS) - 1)


def resolve(choice: str, calibrated: bool) -> str:
    """``auto`` → ``calibration`` for a calibrated (CPU) profile, else ``learn``."""
    if choice not in ROUTER_STEPS:
        raise ValueError(f"router steps: one of {', '.join(ROUTER_STEPS)}, got {choice!r}")
    return ("calibration" if calibrated else "learn") if choice == "auto" else choice

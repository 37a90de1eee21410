"""The timed contention (calibrate/contention.py): a real second process, on the tiny model."""

import pytest

from warmpath.calibrate.contention import measure_contention


def test_decode_steps_are_timed_alone_and_beside_a_second_process(tiny):
    got = measure_contention(tiny, "tiny", "none", batch=2, context=64, steps=12, neighbour_tokens=64)
    assert (got["batch"], got["context"], got["steps"]) == (2, 64, 12)
    assert got["neighbour_steps"] > 0          # the other process computed while the middle steps ran
    assert got["alone_s"] > 0 and got["beside_s"] > 0
    assert got["contention"] == pytest.approx(max(0.0, got["beside_s"] / got["alone_s"] - 1.0))


def test_a_neighbour_that_dies_is_an_error_at_once_and_leaves_no_process(tiny):
    import multiprocessing as mp
    import time

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        measure_contention(tiny, "no-such-model-spec", "none", batch=1, context=32, steps=2, timeout_s=300)
    assert time.monotonic() - t0 < 120         # not the 300-s start timeout
    assert not [p for p in mp.active_children() if p.is_alive()]


def test_the_served_figure_pools_every_run_by_its_steps_beside():
    """``calibrate``'s default contention: each traced run's steps over the fit
    (``step_trace.contention_over_model``, min 20 of each), pooled by steps beside; none below 0."""
    from warmpath.calibrate.cli import _contention_served
    from warmpath.engine.step_model import StepModel
    from warmpath.engine.step_trace import overlaps

    m = StepModel((0.0, 1e-3, 0.0), (0.01, 0.01, 0.0))      # a decode of one: 0.02 s
    step = lambda t0, exec_s: {"t0": t0, "t1": t0 + 0.1, "exec_s": exec_s, "items": [[1, 50]]}  # noqa: E731

    def run(alone_s: float, beside_s: float, n_beside: int) -> tuple[dict, dict]:
        d = [step(i, alone_s) for i in range(20)] + [step(100 + i, beside_s) for i in range(n_beside)]
        steps = {"d": d, "p": [{"t0": 100.0, "t1": 100.0 + n_beside, "exec_s": 1.0, "items": [[512, 0]]}]}
        return steps, overlaps(steps)

    got = _contention_served({"a": run(0.02, 0.024, 20), "b": run(0.02, 0.021, 60)}, m)
    assert (round(got["contention"], 9), got["steps_beside"]) == (round((0.2 * 20 + 0.05 * 60) / 80, 9), 80)
    assert _contention_served({"a": run(0.02, 0.019, 20)}, m)["contention"] == 0.0    # faster beside: noise
    assert _contention_served({"a": run(0.02, 0.024, 19)}, m) is None                 # too few beside

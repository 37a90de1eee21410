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

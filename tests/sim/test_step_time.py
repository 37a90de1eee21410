"""Step-time models: the fitted profile and seeded step-to-step variation."""

import statistics

import pytest

from warmpath.engine.step_model import StepModel
from warmpath.sim.step_time import Fitted, Jittered


def test_fitted_is_the_step_model():
    m = StepModel((0.07, 0.0027, 1e-6), (0.017, 0.0037, 3e-5))
    items = [(1, 1600), (1, 1700), (64, 1536)]
    assert Fitted(m).step_s(items) == m.step_s(items)


def test_jittered_is_seeded_with_mean_one_and_the_given_cv():
    m = Fitted(StepModel((0.1, 0.0, 0.0), (0.1, 0.0, 0.0)))
    a = [Jittered(m, 0.05, "s/w").step_s([(8, 0)]) for _ in range(3)]
    assert a[0] == a[1] == a[2]                                   # one draw each, same seed
    j, k = Jittered(m, 0.05, "s/w"), Jittered(m, 0.05, "s/w")
    xs = [j.step_s([(8, 0)]) / 0.1 for _ in range(20000)]
    assert xs[:50] == [k.step_s([(8, 0)]) / 0.1 for _ in range(50)]
    assert Jittered(m, 0.05, "other").step_s([(8, 0)]) != xs[0]
    assert statistics.fmean(xs) == pytest.approx(1.0, abs=0.002)
    assert statistics.stdev(xs) == pytest.approx(0.05, rel=0.03)
    assert Jittered(m, 0.0, 1).step_s([(8, 0)]) == 0.1
    assert Jittered(m, 0.05, 1).step_s([]) == 0.0
    with pytest.raises(ValueError, match="cv"):
        Jittered(m, -0.1, 1)

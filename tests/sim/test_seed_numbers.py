"""``sim/seed_numbers.py``: ranges, single values and open ends, as checked and printed."""

import pytest

from warmpath.sim.seed_numbers import CPD, PPD, SeedValue


def test_holds_a_range_strictly_and_a_point_within_a_tolerance():
    r = SeedValue(0.75, 0.8, "QPS/GPU", "x")
    assert (r.holds(0.75), r.holds(0.8), r.holds(0.81), r.holds(None)) == (True, True, False, None)
    p = SeedValue(-0.68, -0.68, "%", "x")
    assert (p.holds(-0.66), p.holds(-0.66, 0.1), p.holds(-0.74, 0.1), p.holds(-0.75, 0.1)) == (False, True, True, False)
    assert SeedValue(1.0, float("inf"), "s", "x").holds(40.0) is True


def test_text():
    assert SeedValue(0.75, 0.8, "QPS/GPU", "x").text() == "0.75 to 0.8 QPS/GPU"
    assert PPD["x1_turn2_ttft_change"].text() == "-73% to -48%"
    assert PPD["ppd_turn2_ttft_change_avg"].text() == "-68%"
    assert PPD["fig5_pd_turn2_ttft_ms"].text() == "143.7 to 170.6 ms"
    assert CPD["ttft_p50_near_saturation_s"]["2P1D"].text() == "> 1 s"


def test_every_value_names_its_source_and_the_blog_gives_no_2d_plateau():
    vals = [v for d in (CPD, PPD) for v in d.values() if isinstance(v, SeedValue)]
    vals += [v for d in (CPD["plateau_qps_per_gpu"], CPD["ttft_p50_near_saturation_s"]) for v in d.values() if v]
    assert all("seed" in v.source for v in vals)
    assert CPD["plateau_qps_per_gpu"]["2P2D"] is None and CPD["plateau_qps_per_gpu"]["CPD-2D"] is None


def test_rejects_an_inverted_range():
    with pytest.raises(ValueError):
        SeedValue(2.0, 1.0, "s", "x")

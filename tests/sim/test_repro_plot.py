"""``sim/repro_plot.py``: both figures are written, with and without a bandwidth sweep."""

from tests.sim.test_repro_compare import CPD_TABLE, _p
from warmpath.sim.repro_plot import cpd_figure, ppd_figure


def test_figures_are_written(tmp_path):
    table = {"4.0/1P3D-x0": _p(0.1), "4.0/1P3D-x1": _p(0.04), "12.0/1P3D-x0": _p(0.2), "12.0/1P3D-dynamic": _p(0.06)}
    paths = [cpd_figure(CPD_TABLE, tmp_path / "c.png"), ppd_figure(table, {"25": {"PD": 0.2, "PPD": 0.05}},
             tmp_path / "p.png"), ppd_figure(table, None, tmp_path / "q" / "p.png")]
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)

"""``warmpath map``: the grid, the gains (with what a finite rate grid allows to say), the
operating point's cell, map.json's schema, and a tiny end-to-end run (PNG + JSON, the same
for a seed whatever ``--jobs``)."""

import json
from dataclasses import replace

import pytest

from warmpath.cli import main
import warmpath.sim.map as map_mod
from warmpath.sim.map import MapConfig, cpd_topology, grid, operating_point, quick, run_map, sustained_gain, ttft_gain
from warmpath.sim.map_plot import arm_text, cell_text, colorbar_ticks, facet_title, fmt_seconds, fmt_value, settings_text

RATES = (0.2, 0.4, 0.6, 0.8)


def test_grid_enumerates_rows_cols_y_x():
    cfg = MapConfig("cpd", cold_shares=(0.2, 0.5), cold_tokens=(1024,), answers=(128, 512), splits=("2P1D",))
    assert grid(cfg) == [
        {"answer": 128, "split": "2P1D", "cold_share": 0.2, "cold_tokens": 1024},
        {"answer": 128, "split": "2P1D", "cold_share": 0.5, "cold_tokens": 1024},
        {"answer": 512, "split": "2P1D", "cold_share": 0.2, "cold_tokens": 1024},
        {"answer": 512, "split": "2P1D", "cold_share": 0.5, "cold_tokens": 1024}]
    assert len(grid(MapConfig("cpd"))) == 16 and len(grid(MapConfig("ppd"))) == 36     # the defaults
    assert list(grid(MapConfig("ppd"))[0]) == ["link_gbps", "load", "history", "append"]


def test_cpd_topologies_count_nodes():
    assert cpd_topology("2P1D", "cpd").workers == {"pre-prefill": 1, "prefill": 1, "decode": 4}   # CPD-1D
    assert cpd_topology("3P2D", "cpd").workers == {"pre-prefill": 1, "prefill": 2, "decode": 8}
    assert cpd_topology("2P2D", "pd-kv").workers == {"prefill": 2, "decode": 8}
    assert cpd_topology("2P2D", "pd-kv").policy == "pd-kv"
    assert cpd_topology("2P1D", "replica").workers == {"replica": 3}        # 3 nodes: 3 TP4 replicas, 12 GPUs


def test_sustained_gain_and_its_bounds():
    assert sustained_gain(0.6, 0.4, RATES) == {"value": pytest.approx(1.5), "bound": "=", "note": ""}
    assert sustained_gain(0.4, 0.4, RATES)["value"] == 1.0
    # the baseline sustains nothing: it is below 0.2, so CPD's 0.4 is more than 0.4 / 0.2 = 2x
    assert sustained_gain(0.4, None, RATES) == {"value": 2.0, "bound": ">", "note": "baseline sustains not even 0.2"}
    assert sustained_gain(None, 0.8, RATES)["value"] == 0.25 and sustained_gain(None, 0.8, RATES)["bound"] == "<"
    assert sustained_gain(None, None, RATES)["value"] is None
    # the top of the grid may go higher
    assert sustained_gain(0.8, 0.4, RATES) == {"value": 2.0, "bound": ">=", "note": ""}
    assert sustained_gain(0.4, 0.8, RATES) == {"value": 0.5, "bound": "<=", "note": ""}
    assert sustained_gain(0.8, 0.8, RATES)["value"] is None
    assert [cell_text(sustained_gain(*p, RATES)) for p in ((0.6, 0.4), (0.4, None), (None, 0.8), (0.8, 0.4),
                                                           (None, None))] == ["1.50", ">2.00", "<0.25", "≥2.00", "n/a"]


def test_annotations_keep_three_figures_and_show_the_grid_cut():
    g = lambda v, b="=": {"value": v, "bound": b, "note": ""}      # noqa: E731
    assert [cell_text(g(v)) for v in (1.004, 9.99, 13.44, 203.31, 1352.85)] == ["1.00", "9.99", "13.4", "203", "1353"]
    assert cell_text(g(120.0, ">")) == ">120"
    assert [fmt_seconds(s) for s in (0.028, 0.1234, 1.49, 37.71, None)] == ["28 ms", "123 ms", "1.49 s", "37.7 s", "-"]
    cpd = {"kind": "cpd", "config": {"rates": [0.2, 0.4, 0.8]}, "comparisons": {"cpd_vs_pd": ["cpd", "pd"]}}
    arms = lambda a, b: {"arms": {"cpd": {"2": {"goodput": a}}, "pd": {"2": {"goodput": b}}}}   # noqa: E731
    # not even the lowest rate: below it; the highest: at least it
    assert arm_text(cpd, arms(0.4, None), "cpd_vs_pd", "2") == "0.4 vs <0.2"
    assert arm_text(cpd, arms(0.8, 0.4), "cpd_vs_pd", "2") == "≥0.8 vs 0.4"
    ppd = {"kind": "ppd", "comparisons": {"x1_vs_x0": ["x1", "x0"]}}
    cell = {"arms": {"x1": {"turn2_ttft_p50_s": 0.028}, "x0": {"turn2_ttft_p50_s": 1.49}}}
    assert arm_text(ppd, cell, "x1_vs_x0") == "28 ms vs 1.49 s"
    # the colour bar always marks more than 1x: powers of 2 from 2x on, finer steps below
    assert colorbar_ticks(3.0) == [1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8] and colorbar_ticks(1.0) == [1 / 2, 1, 2]
    assert colorbar_ticks(0.585) == [2 / 3, 0.8, 1, 1.25, 1.5] and colorbar_ticks(0.33) == [0.8, 1, 1.25]
    assert facet_title("link_gbps", 400.0) == "400 Gb/s link" and facet_title("answer", 128) == "128-token answers"
    assert facet_title("split", "2P1D") == "2P1D nodes (P:D)" and facet_title("load", 12.0) == "12 sessions/s"
    text = settings_text({"kind": "cpd", "config": {"duration_s": 20.0, "ramp_s": 10.0, "seed": 0,
                                                    "context_tokens": 65536, "max_in_flight": 24}})
    assert "64K-token warm repositories, 24 admitted in flight" in text and "20 s simulated per point after a 10 s ramp" in text


def test_ttft_gain_is_baseline_over_mode():
    assert ttft_gain(0.05, 0.2) == {"value": 4.0, "bound": "=", "note": ""}
    assert ttft_gain(None, 0.2)["value"] is None and ttft_gain(0.1, None)["value"] is None


def test_operating_points_pick_the_nearest_cell():
    op = operating_point(MapConfig("cpd"))          # the defaults hold the blog's point itself
    assert op["point"] == {"answer": 128, "split": "2P1D", "cold_share": 0.2, "cold_tokens": 65536}
    assert op["cell"] == op["point"] and op["exact"] is True
    near = operating_point(MapConfig("cpd", cold_shares=(0.1, 0.4), cold_tokens=(8192, 131072), answers=(32, 512),
                                     splits=("3P1D", "2P2D")))
    # 0.2 is 0.1 from 0.1 and 0.2 from 0.4; 64K is 8x from 8K, 2x from 128K; 128 is 4x from 32 and from 512
    # (a tie: the first); P:D 2:1 GPUs is 1.5x from 3:1 and 2x from 1:1
    assert near["cell"] == {"answer": 32, "split": "3P1D", "cold_share": 0.1, "cold_tokens": 131072}
    assert near["exact"] is False
    assert operating_point(MapConfig("cpd", context_tokens=4096))["exact"] is False   # not the blog's repositories
    ppd = operating_point(MapConfig("ppd"))
    # ppd-grid: first turns 512+64 and 1024+64 (mean 832), appends 32/256/1024 (mean 437.3)
    assert ppd["point"] == {"link_gbps": 400.0, "load": 12.0, "history": 832.0, "append": pytest.approx(437.333, 1e-4)}
    # ln(832/512) = 0.49 < ln(2048/832) = 0.90; ln(437/256) = 0.53 < ln(1024/437) = 0.85
    assert ppd["cell"] == {"link_gbps": 400.0, "load": 12.0, "history": 512, "append": 256} and not ppd["exact"]


def test_config_is_validated():
    for bad in ({"kind": "x"}, {"rates": (0.4, 0.2)}, {"cold_shares": (1.0,)}, {"splits": ("1P1D",)},
                {"splits": ("2P",)}, {"answers": ()}, {"histories": (128, 512)}, {"loads": (0.0,)},
                {"cold_tokens": (1024, 1024)}, {"kv_blocks": 0}):
        with pytest.raises(ValueError, match="map: "):
            MapConfig(**bad)
    assert fmt_value(65536) == "64K" and fmt_value(0.2) == "0.2" and fmt_value(400.0) == "400"


def _without_walls(x):
    if isinstance(x, dict):
        return {k: _without_walls(v) for k, v in x.items() if k != "wall_s"}
    return [_without_walls(v) for v in x] if isinstance(x, list) else x


def test_tiny_cpd_map_end_to_end(tmp_path, capsys):
    cfg = replace(quick("cpd"), cold_shares=(0.5,))
    out = tmp_path / "cpd"
    assert main(["map", "cpd", "--quick", "--cold-shares", "0.5", "--jobs", "2", "--out", str(out)]) == 0
    m = json.loads((out / "map.json").read_text())
    for png in ("cpd_vs_pd", "cpd_vs_pd-kv", "cpd_vs_replica", "winner"):
        assert (out / f"{png}.png").stat().st_size > 0
    assert set(m) == {"kind", "config", "metric", "slo", "dims", "comparisons", "operating_point", "cells", "wall_s",
                      "reused_runs", "arms", "tpot_targets"}
    # one line per arm and TPOT target
    assert m["reused_runs"] == 0 and len((out / "cells.jsonl").read_text().splitlines()) == 4 * 3
    assert m["slo"]["ttft_p90"] == 2.0 and m["slo"]["attain"] == 0.9 and m["slo"]["tpot_targets"] == ["none", "2", "1.3"]
    assert ">= 90% of requests attain TTFT <= 2.0 s" in m["metric"]
    assert m["dims"] == [{"name": "answer", "values": [32]}, {"name": "split", "values": ["2P1D"]},
                         {"name": "cold_share", "values": [0.5]}, {"name": "cold_tokens", "values": [2048]}]
    assert m["comparisons"] == {"cpd_vs_pd": ["cpd", "pd"], "cpd_vs_pd-kv": ["cpd", "pd-kv"],
                                "cpd_vs_replica": ["cpd", "replica"]}
    (cell,) = m["cells"]
    for arm in cell["arms"].values():      # 4 admitted at a time: 1.0/GPU passes, 4.0 fails, nothing above it runs
        for lab in ("none", "2", "1.3"):
            assert arm[lab]["sustained"] == 1.0 and arm[lab]["goodput"] == 1.0 and arm[lab]["gpus"] == 12
            assert [(r, v["attained"]) for r, v in arm[lab]["runs"].items()] == [("1.0", True), ("4.0", False)]
        assert arm["none"]["tpot_bound_s"] is None
        assert arm["1.3"]["tpot_bound_s"] == pytest.approx(1.3 * cell["unloaded_tpot_s"])
    assert cell["gain"]["cpd_vs_pd"]["none"] == {"value": 1.0, "bound": "=", "note": ""}
    assert cell["winner"]["1.3"]["arms"] == ["cpd", "pd", "pd-kv", "replica"]      # all tied at 1.0
    assert m["operating_point"]["cell"] == {"answer": 32, "split": "2P1D", "cold_share": 0.5, "cold_tokens": 2048}
    assert "tpot=1.3 | winner cpd=pd=pd-kv=replica 1 | cpd_vs_pd 1.00" in capsys.readouterr().out
    # the same for the seed with one job as with two
    assert _without_walls(run_map(cfg, jobs=1)["cells"]) == _without_walls(m["cells"])


def test_tiny_ppd_map_end_to_end(tmp_path):
    out = tmp_path / "ppd"
    assert main(["map", "ppd", "--quick", "--jobs", "1", "--out", str(out)]) == 0
    m = json.loads((out / "map.json").read_text())
    assert (out / "dynamic_vs_x0.png").exists() and (out / "x1_vs_x0.png").exists() and m["slo"] is None
    assert [(c["history"], c["append"]) for c in m["cells"]] == [(512, 256), (2048, 256)]
    for c in m["cells"]:
        assert c["arms"]["x0"]["ppd_local"] == 0 and c["arms"]["x1"]["ppd_remote"] == 0
        x0, x1 = c["arms"]["x0"]["turn2_ttft_p50_s"], c["arms"]["x1"]["turn2_ttft_p50_s"]
        assert c["gain"]["x1_vs_x0"]["value"] == pytest.approx(x0 / x1) and x0 > x1   # 25 Gb/s: the handoff costs
    again = run_map(replace(quick("ppd")), jobs=2)
    assert _without_walls(again["cells"]) == _without_walls(m["cells"])
    assert main(["map", "ppd", "--quick", "--histories", "16"]) == 2              # not above the 32-token answer
    assert main(["map", "cpd", "--quick", "--rates", "x"]) == 2


def test_an_interrupted_map_resumes_from_its_cell_cache(tmp_path, monkeypatch):
    calls = []

    def fake(cfg, cell, mode):                      # a stand-in for the simulation: what it ran, in order
        calls.append((cell["history"], mode))
        return {"turn2_ttft_p50_s": cell["history"] / 1000 / (1 + len(mode)), "success_rate": 1.0,
                "ppd_local": 0, "ppd_remote": 0, "wall_s": 0.0}

    monkeypatch.setattr(map_mod, "ppd_run", fake)
    cfg, cache, heard = quick("ppd"), tmp_path / "out" / "cells.jsonl", []
    full = run_map(cfg, cache=cache, progress=heard.append)
    assert len(calls) == 6 and full["reused_runs"] == 0 and heard[0].startswith("[1/6] link_gbps=25.0")
    lines = cache.read_text().splitlines()
    assert len(lines) == 6
    # killed after 4 runs, mid-way through writing the 5th
    cache.write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
    calls.clear()
    again = run_map(cfg, cache=cache)
    assert calls == [(2048, "x1"), (2048, "dynamic")] and again["reused_runs"] == 4
    assert again["cells"] == full["cells"]
    calls.clear()
    assert run_map(cfg, cache=cache)["reused_runs"] == 6 and calls == []       # the torn line did not spoil the rest
    # a grown grid reuses the runs it shares; other settings (here the seed) reuse nothing
    calls.clear()
    assert run_map(replace(cfg, histories=(512, 2048, 4096)), cache=cache)["reused_runs"] == 6
    assert calls == [(4096, "x0"), (4096, "x1"), (4096, "dynamic")]
    calls.clear()
    assert run_map(replace(cfg, seed=1), cache=cache)["reused_runs"] == 0 and len(calls) == 6


def test_every_comparison_has_a_figure_title():
    from warmpath.sim.map_plot import TITLES

    names = {n for kind in map_mod.COMPARISONS.values() for n in kind}
    assert names <= set(TITLES), sorted(names - set(TITLES))
    assert map_mod.COMPARISONS["cpd"]["goodput-replica_vs_replica"] == ("goodput-replica", "replica")

"""``sim/map_cpd.py``: the replica arm, TPOT targets from the unloaded TPOT, re-judging a run
under another target, the winner, and the cache keyed by TPOT target (a grown target list
reruns only the new target)."""

import json
from dataclasses import replace

import pytest

import warmpath.sim.map as map_mod
from warmpath.bench.workload import Session, Turn
from warmpath.sim.map import MapConfig, quick, run_map
from warmpath.sim.map_cache import task_key
from warmpath.sim.map_cpd import (arm_setup, rejudge, request_shapes, request_tpot, tpot_label, tpot_target,
                                  unloaded_tpot, winner)


def test_tpot_labels_and_targets():
    assert [tpot_label(x) for x in ("none", "NONE", "2", "1.30", 2.0)] == ["none", "none", "2", "1.3", "2"]
    for bad in ("0.5", "x"):
        with pytest.raises(ValueError, match="map: a TPOT target"):
            tpot_label(bad)
    assert tpot_target("none", 0.004).flat() == {"ttft_p90": 2.0}
    assert tpot_target("1.5", 0.004).flat() == {"ttft_p90": 2.0, "tpot_p90": pytest.approx(0.006)}
    assert MapConfig("cpd", tpot_targets=("none", "1.50")).tpot_targets == ("none", "1.5")
    with pytest.raises(ValueError, match="map: arms"):
        MapConfig("cpd", arms=("cpd", "tp8"))


def test_replica_arm_uses_the_same_gpus():
    s = arm_setup("2P1D", "replica", None, None)
    assert s.topology.workers == {"replica": 3} and s.tp["replica"] == 4 and s.gpus == 12
    assert arm_setup("2P1D", "pd", None, None).gpus == 12 == arm_setup("2P1D", "cpd", None, None).gpus


def test_the_hybrid_arm_and_its_elastic_twin_share_the_layout_only_the_twin_moves_roles():
    h, e = arm_setup("2P1D", "goodput-replica", None, None), arm_setup("2P1D", "goodput-replica-e", None, None)
    assert h.topology.workers == e.topology.workers == {"pre-prefill": 1, "replica": 2}
    assert (h.gpus, e.gpus, h.tp["replica"], h.elastic, e.elastic) == (12, 12, 4, None, "roles")


def test_unloaded_tpot_is_the_mean_batch1_step_over_each_answer():
    sessions = [Session("a", [Turn([0] * 10, 4), Turn([0] * 5, 3)], prefix=[0] * 100),
                Session("b", [Turn([0] * 7, 1)])]
    # a's turn 1: 100 + 10; turn 2: 110 + 4 (answer) + 5; b: 7
    assert request_shapes(sessions) == [(110, 4), (119, 3), (7, 1)]

    class Linear:                   # step = 1 ms + 1 us per context token
        def step_s(self, items):
            ((n, c),) = items
            assert n == 1
            return 1e-3 + 1e-6 * c

    # tokens 2..4 at contexts 111, 112, 113: mean 1 ms + 112 us
    assert request_tpot(Linear(), 110, 4) == pytest.approx(1.112e-3)
    assert request_tpot(Linear(), 7, 1) == 0.0
    cell = {"cold_share": 0.5, "cold_tokens": 2048, "answer": 32}
    u = unloaded_tpot(2048, cell, n=20)
    assert 1e-3 < u < 1e-2 and u == unloaded_tpot(2048, cell, n=20)          # B200 TP1, 8B: a few ms, seeded


def _row(ttft, e2e, out=11, ok=True):
    return {"sid": "s", "turn": 1, "class": "cold", "ok": ok, "ttft_s": ttft, "e2e_s": e2e, "output_tokens": out,
            "prompt_tokens": 100, "cached_tokens": 0, "error": None if ok else "timeout"}


def test_rejudge_applies_the_tpot_bound_per_request():
    # TPOT = (e2e - ttft) / 10: 10 requests at 5 ms, one at 20 ms (1 of 11 = 9% miss: 90.9% attain)
    rows = [_row(0.5, 0.55)] * 10 + [_row(0.5, 0.7)]
    run = {"requests": rows, "duration_s": 10.0, "offered_rps": 1.0, "sim": {"stopped_at_s": None}}
    assert rejudge(run, tpot_target("2", 0.005))["attained"] is True            # bound 10 ms: 10 of 11
    two = rejudge(run, tpot_target("2", 0.005))
    assert two["attainment"] == pytest.approx(10 / 11)
    run["requests"] = rows[:8] + [_row(0.5, 0.7)] * 3                          # 3 of 11 over: 72.7%
    assert rejudge(run, tpot_target("2", 0.005))["attained"] is False
    assert rejudge(run, tpot_target("none", 0.005))["attained"] is True         # TTFT 0.5 s <= 2 s for all
    run["sim"]["stopped_at_s"] = 3.0                                            # stopped early: never attains
    assert rejudge(run, tpot_target("none", 0.005))["attained"] is False


def test_winner_names_ties_and_the_grid_cut():
    rates = (0.2, 0.4, 0.8)
    assert winner({"cpd": 0.4, "pd": 0.2, "replica": None}, rates) == {
        "arms": ["cpd"], "goodput": 0.4, "runner_up": 0.2, "note": ""}
    assert winner({"cpd": 0.8, "replica": 0.8}, rates)["note"] == "tied at the highest rate 0.8: may go higher"
    assert winner({"cpd": 0.8, "replica": 0.4}, rates)["note"] == "cpd sustains the highest rate 0.8: may go higher"
    assert winner({"cpd": None, "pd": None}, rates)["arms"] == []
    assert winner({"pd": 0.4, "replica": 0.4}, rates)["runner_up"] is None


def test_cache_keys_carry_the_tpot_target_and_a_grown_list_reruns_only_it(tmp_path, monkeypatch):
    calls = []

    def fake(cfg, cell, arm, labels):
        calls.append((arm, labels))
        g = {"cpd": 1.0, "pd": None, "pd-kv": None, "replica": 4.0}[arm]
        return {lab: {"goodput": g if lab == "none" else None, "sustained": g, "unloaded_tpot_s": 0.005,
                      "tpot_bound_s": None, "gpus": 12, "wall_s": 0.0, "runs": {}} for lab in labels}

    monkeypatch.setattr(map_mod, "cpd_sweep", fake)
    cfg = replace(quick("cpd"), cold_shares=(0.5,), tpot_targets=("none",))
    cache = tmp_path / "cells.jsonl"
    m = run_map(cfg, cache=cache)
    assert calls == [(a, ("none",)) for a in ("cpd", "pd", "pd-kv", "replica")]
    (c,) = m["cells"]
    assert c["winner"]["none"]["arms"] == ["replica"] and c["gain"]["cpd_vs_replica"]["none"]["value"] == 0.25
    assert c["gain"]["cpd_vs_pd"]["none"]["bound"] == ">"                        # pd sustains not even 1.0
    calls.clear()
    grown = run_map(replace(cfg, tpot_targets=("none", "1.3")), cache=cache)
    assert calls == [(a, ("1.3",)) for a in ("cpd", "pd", "pd-kv", "replica")] and grown["reused_runs"] == 4
    assert grown["cells"][0]["winner"]["1.3"]["arms"] == []
    calls.clear()
    assert run_map(replace(cfg, tpot_targets=("1.3", "none")), cache=cache)["reused_runs"] == 8 and calls == []
    # a key from before the targets (its cell without tpot_target) never matches one of now
    cell = dict(map_mod.grid(cfg)[0])
    assert task_key({}, cell, "cpd") != task_key({}, {**cell, "tpot_target": "none"}, "cpd")
    # fewer arms: only their runs; the comparisons name only arms that ran
    calls.clear()
    m = run_map(replace(cfg, arms=("cpd", "pd")), cache=cache)
    assert calls == [] and m["comparisons"] == {"cpd_vs_pd": ["cpd", "pd"]} and m["arms"] == ["cpd", "pd"]


def test_the_goodput_arm_runs_one_sweep_per_tpot_target(tmp_path):
    from warmpath.cli import main

    out = tmp_path / "gp"
    assert main(["map", "cpd", "--quick", "--cold-shares", "0.5", "--arms", "cpd,goodput",
                 "--tpot-targets", "none,1.3", "--out", str(out)]) == 0
    m = json.loads((out / "map.json").read_text())
    assert m["arms"] == ["cpd", "goodput"] and m["comparisons"] == {"goodput_vs_cpd": ["goodput", "cpd"]}
    (cell,) = m["cells"]
    gp = cell["arms"]["goodput"]
    assert gp["none"]["tpot_bound_s"] is None
    assert gp["1.3"]["tpot_bound_s"] == pytest.approx(1.3 * cell["unloaded_tpot_s"])
    assert gp["none"]["gpus"] == cell["arms"]["cpd"]["none"]["gpus"] == 12
    assert set(cell["winner"]) == {"none", "1.3"}
    assert (out / "goodput_vs_cpd.png").stat().st_size > 0

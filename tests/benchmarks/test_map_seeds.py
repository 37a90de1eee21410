"""The map goal over seeds (``benchmarks/policies/map_seeds.py``): ratio to the best fixed arm,
met at 0.97 of it or where no fixed arm sustains anything."""

import pytest

from benchmarks.policies.map_seeds import compare, verdict


def test_verdict_is_the_ratio_to_the_best_fixed_and_met_at_097():
    assert verdict(0.6, 0.6) == (1.0, True)
    assert verdict(0.5, 0.6) == (pytest.approx(5 / 6), False)
    assert verdict(0.97, 1.0) == (pytest.approx(0.97), True)
    assert verdict(None, 0.4) == (0.0, False)           # the arm sustains nothing
    assert verdict(None, None) == (None, True)          # nor does any fixed arm
    assert verdict(0.3, None) == (None, True)


def cell(split, goodputs):
    """A map cell: arm -> {target: goodput}."""
    return {"split": split, "cold_share": 0.2, "cold_tokens": 16384, "answer": 128,
            "arms": {a: {t: {"goodput": g} for t, g in ts.items()} for a, ts in goodputs.items()}}


def test_compare_counts_each_seed_and_target():
    m = {"arms": ["cpd", "replica", "ga"], "tpot_targets": ["none", "2"], "config": {"rates": [0.2, 1.2]},
         "cells": [cell("2P1D", {"cpd": {"none": 1.2, "2": 0.3}, "replica": {"none": 1.0, "2": 0.4},
                                 "ga": {"none": 0.8, "2": 0.6}}),
                   cell("2P2D", {"cpd": {"none": None, "2": None}, "replica": {"none": 0.5, "2": None},
                                 "ga": {"none": 0.5, "2": 0.2}})]}
    got = compare({"0": m}, "ga", fixed=("cpd", "replica"))
    assert got["met"] == {"0": {"none": "1/2", "2": "2/2"}}
    first = got["rows"][0]
    assert (first["cell"], first["tpot"], first["best_fixed"], first["best_arms"], first["met"]) == (
        "2P1D cold 0.2 doc 16K answer 128", "none", 1.2, ["cpd"], False)
    assert first["ratio"] == pytest.approx(2 / 3)
    assert [r["ratio"] for r in got["rows"][1:]] == [pytest.approx(1.5), 1.0, None]
    with pytest.raises(ValueError, match="no arm 'x'"):
        compare({"0": m}, "x")

"""The step model's mixed-step fit: every number worked out by hand (no torch)."""

import itertools
import json

import numpy as np
import pytest

from warmpath.engine.step_model import MIXED_MIN_ROWS, StepModel, StepProfile, fit_mixed, mixed_row, nnls

TRUE = (0.02, 0.002, 1e-6, 0.004, 2e-5)   # m0, m1·t, m2·t·c_prefill, m3·b, m4·b·c_decode


def exact(b, cd, t, cp):
    m0, m1, m2, m3, m4 = TRUE
    return m0 + m1 * t + m2 * t * cp + m3 * b + m4 * b * cd


def profile(mixed_rows):
    """Prefill 0.05 + 0.001·t and decode 0.01 + 0.003·b, exactly; ``mixed_rows`` as given."""
    return StepProfile(prefill=[(t, c, 0.05 + 0.001 * t) for t in (16, 64, 256) for c in (0, 512)],
                       decode=[(b, c, 0.01 + 0.003 * b) for b in (1, 4, 16) for c in (100, 900)],
                       mixed=mixed_rows)


GRID = [(b, cd, t, cp, exact(b, cd, t, cp))
        for b, cd, t, cp in itertools.product((1, 4, 16), (128, 1600), (16, 64, 256), (128, 1600))]


def test_a_profile_made_from_known_coefficients_gives_them_back():
    m = profile(GRID).fit()
    assert m.mixed_coef == pytest.approx(TRUE, rel=1e-7, abs=1e-12)
    assert m.mixed_rows == 36
    # 0.02 + 0.002·100 + 1e-6·100·500 + 0.004·4 + 2e-5·4·1000 = 0.02 + 0.2 + 0.05 + 0.016 + 0.08
    assert m.mixed_s(4, 1000, 100, 500) == pytest.approx(0.366)
    assert m.mixed_s(4, 500, 100) == pytest.approx(0.02 + 0.2 + 0.05 + 0.016 + 0.04)   # one context
    assert m.mixed_form.startswith("fitted") and "36 mixed steps" in m.mixed_form


def test_step_s_prices_decodes_with_prefill_chunks_by_the_mixed_fit():
    m = profile(GRID).fit()
    # decodes at 100 and 300 (mean 200); chunks 32 at 100 and 16 at 400: 48 tokens at 200
    items = [(1, 100), (1, 300), (32, 100), (16, 400)]
    assert m.step_s(items) == pytest.approx(0.02 + 0.002 * 48 + 1e-6 * 48 * 200 + 0.004 * 2 + 2e-5 * 2 * 200)
    assert m.step_s([(1, 100), (1, 300)]) == pytest.approx(m.decode_s(2, 200))          # no chunk
    assert m.step_s([(32, 100), (16, 400)]) == pytest.approx(m.prefill_s(48, 200))      # no decode


def test_too_few_mixed_rows_keep_the_assumed_form_and_say_so():
    m = profile(GRID[:MIXED_MIN_ROWS - 1]).fit()
    assert m.mixed_coef == () and m.mixed_rows == MIXED_MIN_ROWS - 1
    # decode 0.01 + 0.003·4 = 0.022; prefill 0.05 + 0.001·100 = 0.15, less a0 = 0.05: 0.122
    assert m.mixed_s(4, 1000, 100) == pytest.approx(0.122)
    d = m.to_json()
    assert d["mixed_coef"] is None and d["mixed_form"].startswith("assumed: decode + prefill - a0")
    assert profile(GRID[:MIXED_MIN_ROWS]).fit().mixed_coef != ()


def test_coefficients_stay_non_negative():
    # s = 0.05 + 0.001·t − 0.001·b: unconstrained least squares would give m3 = −0.001
    rows = [(b, 500, t, 500, 0.05 + 0.001 * t - 0.001 * b) for b in (1, 2, 4) for t in (16, 64, 256)]
    got = fit_mixed(rows)
    assert min(got) >= 0 and got[3] == 0.0
    # the active set by hand: y = (1, −1) against the identity is x = (1, 0)
    assert nnls(np.eye(2), np.array([1.0, -1.0])).tolist() == [1.0, 0.0]
    # both columns useful and positive: plain least squares
    assert nnls(np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), np.array([1.0, 4.0, 3.0])) == pytest.approx([1, 2])


def test_the_fit_weighs_relative_error():
    # one shape timed at 1 s and at 2 s: the prediction p minimises ((p − 1)/1)² + ((p − 2)/2)²,
    # i.e. (p − 1) + (p − 2)/4 = 0, p = 1.2 (plain least squares would say 1.5)
    m0, m1, m2, m3, m4 = fit_mixed([(1, 0, 10, 0, 1.0), (1, 0, 10, 0, 2.0)] * 3)
    assert m0 + 10 * m1 + m3 == pytest.approx(1.2)


def test_json_round_trip_and_old_calibrations_load():
    m = profile(GRID).fit()
    assert StepModel.from_json(json.loads(json.dumps(m.to_json()))) == m
    old = {"prefill_coef": [0.05, 0.001, 0.0], "decode_coef": [0.01, 0.003, 0.0], "decode_scale": [1.1]}
    o = StepModel.from_json(old)
    assert o.mixed_coef == () and o.mixed_rows == 0
    assert o.mixed_s(1, 0, 100) == pytest.approx(1.1 * 0.013 + 0.1)
    # an old 4-tuple mixed row (batch, context, tokens, s) has one context for both
    assert mixed_row((4, 512, 64, 0.3)) == (4, 512, 64, 512, 0.3)
    assert profile([(b, cd, t, s) for b, cd, t, cp, s in GRID if cp == cd]).fit().mixed_coef == \
        pytest.approx(TRUE, rel=1e-7, abs=1e-12)


def test_calibrate_refit_fits_the_timed_steps_again_and_keeps_the_rest(tmp_path, capsys):
    from warmpath.cli import main

    prof = profile(GRID)
    old = StepModel((0.05, 0.001, 0.0), (0.01, 0.003, 0.0))     # an earlier version's output: no mixed fit
    src, out = tmp_path / "old.json", tmp_path / "new.json"
    src.write_text(json.dumps({"step_model": old.to_json(), "kv_bytes_per_token": 46080, "step_cv": 0.04,
                               "profile": {"prefill": prof.prefill, "decode": prof.decode, "mixed": prof.mixed}}))
    assert main(["calibrate", "--refit", str(src), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    m = StepModel.from_json(got["step_model"])
    assert m.mixed_coef == pytest.approx(TRUE, rel=1e-7, abs=1e-12) and m.mixed_rows == 36
    assert m.prefill_coef == pytest.approx((0.05, 0.001, 0.0), abs=1e-9)
    assert got["step_cv"] == 0.04 and got["refit_of"] == str(src) and len(got["ppd_table"]) == 36
    assert "36 mixed steps" in capsys.readouterr().out


def test_calibrate_refit_names_a_file_without_timed_steps(tmp_path, capsys):
    from warmpath.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text('{"step_model": {}}')
    assert main(["calibrate", "--refit", str(bad), "--out", str(tmp_path / "o.json")]) == 2
    assert "--refit" in capsys.readouterr().err


def test_decode_factor_prices_decodes_and_only_them():
    # decode (0.01 + 0.003·b + 1e-5·b·c), batch 1 corrected by 1.1; mixed 0.02 + 0.001·t + 0.002·b + 1e-5·b·c
    m = StepModel((0.05, 0.001, 0.0), (0.01, 0.003, 1e-5), (1.1,), (0.02, 0.001, 0.0, 0.002, 1e-5), 27,
                  decode_factor=2.0)
    assert m.decode_s(1, 100) == pytest.approx(2 * 1.1 * (0.01 + 0.003 + 0.001))      # 0.0308
    assert m.decode_s(2, 100) == pytest.approx(2 * (0.01 + 0.006 + 0.002))            # 0.036
    assert m.prefill_s(100, 0) == pytest.approx(0.05 + 0.1)                           # prefills as calibrated
    # a mixed step: its prefill terms as fitted, its decode terms doubled: 0.02 + 0.01 + 2·(0.002 + 0.001)
    assert m.mixed_s(1, 100, 10, 100) == pytest.approx(0.036)
    # the assumed mixed form adds the prefill chunk to the (doubled) decode: 0.0308 + 0.01
    assumed = StepModel((0.05, 0.001, 0.0), (0.01, 0.003, 1e-5), (1.1,), decode_factor=2.0)
    assert assumed.mixed_s(1, 100, 10, 0) == pytest.approx(0.0408)
    assert StepModel.from_json(json.loads(json.dumps(m.to_json()))) == m
    assert StepModel.from_json({"prefill_coef": [0, 0, 0], "decode_coef": [0, 1, 0]}).decode_factor == 1.0
    with pytest.raises(ValueError, match="decode_factor"):
        StepModel((0.05, 0.001, 0.0), (0.01, 0.003, 0.0), decode_factor=0.0)


def test_fit_linear_never_returns_a_negative_term():
    from warmpath.engine.step_model import fit_linear

    # s = 0.010 + 0.002·a exactly (c = 0): both terms found, no a·c term
    assert [round(v, 9) for v in fit_linear([(1, 0, 0.012), (2, 0, 0.014), (4, 0, 0.018)])] == [0.01, 0.002, 0.0]
    # batch 4 a little faster than batch 1: least squares would give a negative per-sequence term;
    # constrained, the line is flat at the mean, 0.0115 s
    k = fit_linear([(1, 0, 0.012), (1, 0, 0.012), (4, 0, 0.011), (4, 0, 0.011)])
    assert [round(v, 9) for v in k] == [0.0115, 0.0, 0.0]

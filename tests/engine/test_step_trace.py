"""Step traces: reading, overlap, the profile fitted on steps that ran alone, variation."""

import math

import pytest

from warmpath.engine.step_model import StepModel
from warmpath.engine.step_trace import (contention_over_model, overlaps, profile_from_trace, read_step_trace,
                                        trace_variation)


def test_read_step_trace_file_or_folder(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"t0": 0, "t1": 1, "items": [[1, 5]]}\n\n')
    (tmp_path / "b.jsonl").write_text('{"t0": 2, "t1": 3, "items": [[8, 0]]}\n')
    assert read_step_trace(tmp_path) == {"a": [{"t0": 0, "t1": 1, "items": [[1, 5]]}],
                                         "b": [{"t0": 2, "t1": 3, "items": [[8, 0]]}]}
    assert list(read_step_trace(tmp_path / "b.jsonl")) == ["b"]


def test_read_step_trace_takes_gzipped_traces(tmp_path):
    import gzip

    (tmp_path / "decode-0.jsonl.gz").write_bytes(gzip.compress(b'{"t0": 0, "t1": 1, "items": [[1, 5]]}\n'))
    (tmp_path / "prefill-0.jsonl").write_text('{"t0": 2, "t1": 3, "items": [[8, 0]]}\n')
    (tmp_path / "prefill-0.jsonl.gz").write_bytes(gzip.compress(b'{"t0": 9, "t1": 9, "items": []}\n'))
    assert read_step_trace(tmp_path) == {"decode-0": [{"t0": 0, "t1": 1, "items": [[1, 5]]}],
                                         "prefill-0": [{"t0": 2, "t1": 3, "items": [[8, 0]]}]}   # plain wins
    assert read_step_trace(tmp_path / "decode-0.jsonl.gz") == {"decode-0": [{"t0": 0, "t1": 1, "items": [[1, 5]]}]}


def test_overlaps_are_other_workers_seconds_over_the_step():
    steps = {"a": [{"t0": 0.0, "t1": 1.0}, {"t0": 2.0, "t1": 3.0}],
             "b": [{"t0": 0.5, "t1": 2.25}],
             "c": [{"t0": 2.0, "t1": 3.0}]}
    got = overlaps(steps)
    assert got["a"] == [0.5, 1.25]           # b half of the first; b a quarter + c all of the second
    assert got["b"] == [pytest.approx((0.5 + 0.25 + 0.25) / 1.75)]
    assert got["c"] == [1.25]                # all of a's second step and a quarter of b


def test_profile_from_trace_keeps_single_prefills_pure_decodes_and_mixed_steps_that_ran_alone():
    steps = {"w": [
        {"t0": 0.0, "t1": 0.5, "tiers_s": 0.1, "items": [[64, 1536]]},          # prefill: 0.4 s
        {"t0": 1.0, "t1": 1.1, "tiers_s": 0.0, "items": [[1, 1600], [1, 1700]]},  # decode of 2
        {"t0": 2.0, "t1": 2.3, "items": [[1, 100], [1, 300], [32, 100], [16, 400]]},  # mixed: 0.3 s
        {"t0": 3.0, "t1": 3.2, "items": [[16, 0], [16, 0]]},                    # two prefills: left out
        {"t0": 4.0, "t1": 4.0, "items": [[8, 0]]},                              # no time: left out
        {"t0": 5.0, "t1": 6.0, "items": [[8, 0]]},                              # beside v's step: left out
    ], "v": [{"t0": 5.5, "t1": 5.6, "items": [[1, 10]]}]}                      # beside w's: left out
    p = profile_from_trace(steps)
    assert [(n, c, round(t, 9)) for n, c, t in p.prefill] == [(64, 1536, 0.4)]
    assert [(b, c, round(t, 9)) for b, c, t in p.decode] == [(2, 1650, 0.1)]
    # 2 decodes at mean context 200; 48 prefill tokens at (32·100 + 16·400) / 48 = 200
    assert [(b, cd, t, cp, round(s, 9)) for b, cd, t, cp, s in p.mixed] == [(2, 200, 48, 200, 0.3)]


def test_trace_variation_scatter_alone_and_slowdown_beside_one_other():
    # worker a: five 10-token prefills alone, then five beside b's steps; two decodes alone
    alone = [{"t0": i, "t1": i + 0.1, "exec_s": e, "items": [[10, 0]]}
             for i, e in enumerate([0.09, 0.11, 0.10, 0.10, 0.10])]
    beside = [{"t0": 10 + i, "t1": 10 + i + 0.11, "exec_s": e, "items": [[10, 0]]}
              for i, e in enumerate([0.11, 0.12, 0.11, 0.10, 0.11])]
    decodes = [{"t0": 20 + i, "t1": 20.5 + i, "exec_s": 0.5, "items": [[1, 300]]} for i in range(2)]
    other = [{"t0": 10 + i - 0.01, "t1": 10 + i + 0.2, "exec_s": 0.2, "items": []} for i in range(5)]
    got = trace_variation({"a": alone + beside + decodes, "b": other})
    # the prefills alone scatter by sqrt(0.02 / 5) around their mean; the two decodes are a
    # shape with fewer than 3 steps alone and count for nothing
    assert got["step_cv"] == pytest.approx(math.sqrt(0.02 / 5))
    assert got["contention"] == pytest.approx(0.11 / 0.10 - 1)       # medians of the one shape
    assert (got["steps_alone"], got["shapes_compared"]) == (7, 1)
    # nothing ran beside another worker: no contention measured
    assert trace_variation({"a": alone})["contention"] is None


def test_step_model_step_s_decodes_prefills_and_mixed():
    m = StepModel((0.05, 0.002, 1e-6), (0.01, 0.003, 1e-5))
    assert m.step_s([(64, 1536)]) == pytest.approx(m.prefill_s(64, 1536))
    assert m.step_s([(1, 100), (1, 300)]) == pytest.approx(m.decode_s(2, 200))
    # prefill tokens at their token-weighted context; beside decodes without the fixed part
    assert m.step_s([(30, 0), (10, 400)]) == pytest.approx(m.prefill_s(40, 100))
    assert m.step_s([(1, 100), (32, 100)]) == pytest.approx(m.decode_s(1, 100) + m.prefill_s(32, 100) - 0.05)
    assert m.step_s([]) == 0.0


def test_fit_corrects_the_decode_line_per_batch_size_while_rows_last():
    from warmpath.engine.step_model import StepProfile

    prof = StepProfile(prefill=[(t, c, 0.05 + 0.001 * t) for t in (16, 64, 256) for c in (0, 512)])
    # batch 1 and 3 on the line 0.01 + 0.01·b, batch 2 20% above it, batch 4 with too few rows
    prof.decode = ([(1, c, 0.02) for c in (100, 200)] * 5 + [(2, c, 0.036) for c in (100, 200)] * 5
                   + [(3, c, 0.04) for c in (100, 200)] * 5 + [(4, 100, 0.05)])
    m = prof.fit(min_rows=10)
    assert len(m.decode_scale) == 3
    # with the correction each measured batch size is met (the line alone cannot: b=2 is off it)
    assert [round(m.decode_s(b, 150), 4) for b in (1, 2, 3)] == [0.02, 0.036, 0.04]
    assert StepModel(m.prefill_coef, m.decode_coef).decode_s(2, 150) != pytest.approx(0.036, rel=0.05)
    assert m.decode_s(4, 150) == pytest.approx(m.decode_coef[0] + 4 * m.decode_coef[1] + 600 * m.decode_coef[2])
    assert StepModel.from_json(m.to_json()) == m
    assert StepModel.from_json({"prefill_coef": [0, 0, 0], "decode_coef": [0, 1, 0]}).decode_scale == ()


def test_contention_over_model_compares_every_shape_over_the_fit_alone_and_beside_one_other():
    m = StepModel((0.0, 1e-3, 0.0), (0.01, 0.01, 0.0))      # decode of b: 0.01 + 0.01·b s
    step = lambda t0, b, exec_s: {"t0": t0, "t1": t0 + 0.1, "exec_s": exec_s, "items": [[1, 50]] * b}  # noqa: E731
    d = [step(0, 1, 0.02), step(1, 3, 0.04), step(2, 1, 0.022),          # alone: 1.0, 1.0, 1.1 of the model
         step(10, 2, 0.036), step(11, 1, 0.024), step(12, 3, 0.052),      # beside p: 1.2, 1.2, 1.3
         step(19.95, 1, 0.5)]                                             # half beside p: neither
    e = [step(3, 1, 0.02), step(4, 1, 0.02), step(5, 1, 0.02),            # alone: 1.0
         *(step(t, 1, 0.022) for t in range(13, 19))]                     # beside p: 1.1, six of them
    p = [{"t0": 10.0, "t1": 20.0, "exec_s": 10.0, "items": [[512, 0]]}]   # 0.095 of it beside others: neither
    got = contention_over_model({"d": d, "e": e, "p": p}, m, min_steps=3)
    assert {w: (v["alone"], v["beside"], round(v["contention"], 9)) for w, v in got["workers"].items()} == \
        {"d": (3, 3, 0.2), "e": (3, 6, 0.1)}
    assert got["contention"] == pytest.approx((0.2 * 3 + 0.1 * 6) / 9)   # weighted by the steps beside
    assert contention_over_model({"d": d, "e": e, "p": p}, m, min_steps=4) == {"contention": None, "workers": {}}

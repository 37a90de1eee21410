"""saturation_diag's step accounting and request pairing, by hand (no simulation run)."""

from benchmarks.sim_accuracy.saturation_diag import decode_by_company, paired, step_summary
from warmpath.engine.step_model import StepModel

# prefill 0.01 + 0.001/token; decode 0.02 + 0.01/sequence (no context terms, no scale)
MODEL = StepModel((0.01, 0.001, 0.0), (0.02, 0.01, 0.0))


def test_steps_are_split_by_kind_and_decodes_compared_with_the_model():
    steps = [
        {"t0": 0.0, "t1": 0.04, "tiers_s": 0.0, "items": [[1, 100], [1, 200]]},       # model 0.04: x1.0
        {"t0": 1.0, "t1": 1.06, "tiers_s": 0.0, "items": [[1, 100], [1, 200]]},       # x1.5
        {"t0": 2.0, "t1": 2.05, "tiers_s": 0.02, "items": [[1, 100]]},                # 0.03 of 0.03: x1.0
        {"t0": 3.0, "t1": 3.5, "tiers_s": 0.0, "items": [[1, 100], [64, 10]]},        # mixed: 64 tokens
        {"t0": 4.0, "t1": 4.2, "tiers_s": 0.0, "items": [[100, 0]]},                  # prefill: 100 tokens
        {"t0": 5.0, "t1": 5.0, "tiers_s": 0.0, "items": []},
    ]
    got = step_summary(steps, MODEL)
    assert round(got["decode_s"], 9) == 0.04 + 0.06 + 0.03
    assert round(got["mixed_s"], 9) == 0.5 and round(got["prefill_s"], 9) == 0.2
    assert got["prompt_tokens"] == 164 and got["steps"] == 6
    assert got["decode_over_model"] == {1: 1.0, 2: 1.25}       # batch 2: median of 1.0 and 1.5
    assert got["decode_over_model_all"] == 1.0                 # median of 1.0, 1.5, 1.0


def test_pairs_are_answered_requests_on_both_sides():
    real = [{"sid": "a", "turn": 1, "ok": True, "tpot_s": 0.2, "e2e_s": 10.0},
            {"sid": "b", "turn": 1, "ok": True, "tpot_s": 0.4, "e2e_s": 20.0},
            {"sid": "c", "turn": 1, "ok": False, "tpot_s": None, "e2e_s": None}]
    sim = [{"sid": "a", "turn": 1, "ok": True, "tpot_s": 0.1, "e2e_s": 5.0},
           {"sid": "b", "turn": 1, "ok": True, "tpot_s": 0.4, "e2e_s": 30.0},
           {"sid": "c", "turn": 1, "ok": True, "tpot_s": 0.3, "e2e_s": 9.0}]
    assert paired(real, sim) == {"pairs": 2, "tpot_sim_over_real": 0.75, "e2e_sim_over_real": 1.0}


def test_decode_steps_by_how_many_other_workers_stepped_beside_them():
    """d's three decode steps (model 0.03 each): alone (x1.0), beside p's step (x1.5), beside
    p's and q's (x2.0); its prefill step is left out. p's 1.2-s step has others inside 0.305 s
    of it (d 0.105, q 0.2): 0.25 of a worker, rounded to 0."""
    traces = {
        "d": [{"t0": 0.0, "t1": 0.03, "items": [[1, 100]]},
              {"t0": 1.0, "t1": 1.045, "items": [[1, 100]]},
              {"t0": 2.0, "t1": 2.06, "items": [[1, 100]]},
              {"t0": 3.0, "t1": 3.2, "items": [[100, 0]]}],
        "p": [{"t0": 0.9, "t1": 2.1, "items": [[1, 100]]}],
        "q": [{"t0": 1.9, "t1": 3.5, "items": [[200, 0]]}],
    }
    got = decode_by_company(traces, MODEL)
    assert got["d"] == {0: {"steps": 1, "median": 1.0}, 1: {"steps": 1, "median": 1.5},
                        2: {"steps": 1, "median": 2.0}}
    assert got["p"] == {0: {"steps": 1, "median": 40.0}}   # 1.2 s over the model's 0.03
    assert "q" not in got

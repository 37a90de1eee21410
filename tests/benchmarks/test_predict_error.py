"""The goodput predictor's error report and replay (benchmarks/policies/predict_error.py,
predict_replay.py) on hand-built timelines (no cluster, no workload).

Three requests on decode worker d0 (31-token answers, so 30 steps after the first token):
A, a local document: arrives at 0, first token at 4 (it prefills on d0 over [0, 4]), ends at 8;
B, a remote turn: arrives at 1, first token at 1.5, ends at 7.5, decodes over [1.5, 7.5];
C, a local turn: arrives at 5, first token at 6 (prefills over [5, 6]), ends at 9.
"""

import pytest

from benchmarks.policies.predict_error import measure_item, report, stretches, summarize
from benchmarks.policies.predict_replay import decode_view


def row(sid, path, arrival, first, end, ttft_pred, tpot, tpot_pred, prompt=1000, cached=0):
    return {"source": "real", "seed": 1, "rate": 0.05, "sid": sid, "turn": 1, "path": path, "decode": "d0",
            "prefill": None if path == "local" else "p0", "arrival_s": arrival, "first_s": first, "end_s": end,
            "ttft_s": first - arrival, "predicted_ttft_s": ttft_pred, "tpot_s": tpot, "predicted_tpot_s": tpot_pred,
            "output_tokens": 31, "prompt_tokens": prompt, "cached_tokens": cached, "ok": True}


def rows():
    return [row("A", "local", 0.0, 4.0, 8.0, 5.0, 0.1, 0.1, 2048),
            row("B", "warm", 1.0, 1.5, 7.5, 0.6, 0.2, 0.1, 1600, 1536),
            row("C", "local", 5.0, 6.0, 9.0, 1.0, 0.1, 0.08, 1664, 1600)]


def test_a_decode_is_stretched_by_the_local_prefills_it_overlaps_known_or_later():
    a, b, c = stretches(rows())
    # B's decode [1.5, 7.5]: A's prefill [0, 4] (arrived before it: known) 2.5 s, C's [5, 6] (after) 1 s
    assert (b["stretch_known_s"], b["stretch_later_s"]) == (2.5, 1.0)
    assert (a["stretch_known_s"], a["stretch_later_s"]) == (0.0, 1.0)    # A decodes over [4, 8]: C's
    assert (c["stretch_known_s"], c["stretch_later_s"]) == (0.0, 0.0)    # C decodes over [6, 9]: none


def test_prompts_queued_behind_one_another_count_once():
    # D, local, arrives at 2 while A computes until 4: D is computed over [4, 5.5] (not from 2),
    # C, arriving at 5, over [5.5, 6]. B's decode [1.5, 7.5]: A's 2.5 s known (A arrived before
    # B), D's 1.5 s and C's 0.5 s later (the sum over [2, 5.5] and [5, 6] would be 5.5)
    d = row("D", "local", 2.0, 5.5, 8.0, 3.0, 0.1, 0.1)
    c = row("C", "local", 5.0, 6.0, 9.0, 1.0, 0.1, 0.08)
    a, b, c, d = stretches(rows()[:2] + [c, d])
    assert (b["stretch_known_s"], b["stretch_later_s"]) == (2.5, 2.0)
    assert (a["stretch_known_s"], a["stretch_later_s"]) == (0.0, 2.0)   # A's decode [4, 8]: D's 1.5, C's 0.5


def test_errors_split_the_stretch_from_the_decode_steps():
    b = stretches(rows())[1]
    s = summarize([b])
    assert (s["n"], s["ttft_abs"], s["ttft_signed"]) == (1, 0.2, 0.2)           # 0.6 predicted, 0.5 measured
    assert (s["tpot_abs"], s["tpot_signed"], s["stretched"]) == (0.5, -0.5, 1)   # 0.1 predicted, 0.2 measured
    assert s["stretch_known_per_tok"] == pytest.approx(round(2.5 / 30, 4))
    assert s["stretch_later_per_tok"] == pytest.approx(round(1.0 / 30, 4))
    # less 3.5 s over 30 steps, the decode steps took 0.2 - 0.11667 = 0.08333 s: predicted 0.1 is +20%
    assert s["tpot_decode_only_abs"] == pytest.approx(0.2) and s["tpot_decode_only_signed"] == pytest.approx(0.2)


def test_the_report_groups_by_path_and_rate_and_judges_low_load():
    out = report(stretches(rows()))
    assert out["real"]["local"]["0.05"]["n"] == 2 and out["real"]["remote"]["all"]["n"] == 1
    # every path at 0.05: TTFT errors +0.25 (A: 5 predicted, 4 measured), +0.2 (B), 0 (C): median 0.2
    assert out["real"]["all"]["0.05"]["ttft_abs"] == 0.2
    # TPOT errors 0, -0.5, -0.2: median |error| 0.2
    assert out["real"]["all"]["0.05"]["tpot_abs"] == 0.2
    assert measure_item(out) == {"real": {"ttft_abs": 0.2, "tpot_abs": 0.2, "met": False}}


def test_the_replay_rebuilds_the_decode_worker_as_the_router_saw_it():
    rs = rows()
    a = rs[0]
    new = row("D", "warm", 5.5, 6.0, 9.0, 0.5, 0.1, 0.1)
    # at 5.5: A (local, from its arrival) and C (local, prefilling: 64 tokens queued) and B
    # (remote, from its first token) run there; contexts: prompt + half the answer (15) each
    v = decode_view(rs, "d0", 5.5, new)
    assert (v.running, v.queued_prefill_tokens, v.running_tokens) == (3, 64, 2048 + 1600 + 1664 + 3 * 15)
    v = decode_view(rs, "d0", 1.2, new)       # B still prefilling elsewhere: only A, its 2048 queued
    assert (v.running, v.queued_prefill_tokens, v.running_tokens) == (1, 2048, 2048 + 15)
    assert decode_view(rs, "d0", 0.5, a).running == 0     # the row itself is left out


def test_the_windows_length_comes_from_the_runs_ranking_json(tmp_path):
    import json

    from benchmarks.policies.predict_error import run_duration

    arm = tmp_path / "run" / "real" / "goodput-1p1d_s11"
    arm.mkdir(parents=True)
    assert run_duration([arm]) == 60.0                      # no ranking.json: the default
    (tmp_path / "run" / "ranking.json").write_text(json.dumps({"duration_s": 90.0}))
    assert run_duration([arm]) == 90.0


def test_the_time_a_request_waited_at_the_router_is_added_to_its_prediction(tmp_path):
    import json

    from benchmarks.policies.predict_error import load

    d = tmp_path / "goodput-1p1d_s12"
    d.mkdir()
    held = {**row("H", "local", 0.0, 1.2, 2.2, 0.4, 0.03, 0.03), "server_timing": {"route": 0.8}}
    sent = {**row("S", "local", 0.0, 0.5, 1.5, 0.4, 0.03, 0.03), "server_timing": {"route": 0.0}}
    bare = row("B", "local", 0.0, 0.5, 1.5, 0.4, 0.03, 0.03)       # no Server-Timing: as predicted
    d.joinpath("requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (held, sent, bare)))
    got = {r["sid"]: r["predicted_ttft_s"] for r in load(d)}
    assert got == {"H": pytest.approx(1.2), "S": 0.4, "B": 0.4}
    assert {r["seed"] for r in load(d)} == {12}

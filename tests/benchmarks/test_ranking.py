"""The ranking benchmark's bookkeeping (benchmarks/policies/ranking*.py), by hand (no cluster)."""

import pytest

from benchmarks.policies.ranking import ARMS, goodputs, joint_target, records, verdicts
from benchmarks.policies.ranking_plan import CANDIDATES, plan_candidates
from benchmarks.policies.ranking_sim import rankings, same_order


def row(cls, ttft, tpot, ok=True, turn=1):
    """A requests.jsonl row of a 33-token answer whose TPOT is ``tpot``."""
    return {"sid": f"s{ttft}", "turn": turn, "class": cls, "ok": ok, "ttft_s": ttft if ok else None,
            "e2e_s": ttft + 32 * tpot if ok else None, "output_tokens": 33 if ok else 0, "prompt_tokens": 100,
            "cached_tokens": 0, "error": None if ok else "TimeoutError"}


def test_joint_target_bounds_tpot_at_one_and_a_half_the_unloaded():
    t = joint_target(0.1108)
    assert t.bounds("all").tpot_p90 == pytest.approx(0.1662)
    assert t.bounds("warm").ttft_p90 == 2.0 and t.bounds("cold").ttft_p90 == 20.0


def test_verdicts_judge_the_same_requests_under_both_targets():
    # 10 warm requests: 9 within 2 s and a TPOT of 0.15 s, the tenth 2.5 s; one cold at 9 s with a TPOT of 0.3 s
    rows = [row("warm", 0.5 + 0.1 * i, 0.15) for i in range(9)] + [row("warm", 2.5, 0.15), row("cold", 9.0, 0.3)]
    v = verdicts(records(rows), 60.0, 0.1, {"joint": joint_target(0.11), "ttft": joint_target(10.0)})
    # joint: TPOT bound 0.165 s; the cold request's 0.3 s misses -> cold attainment 0 -> missed
    assert v["joint"]["attainment"] == {"warm": 0.9, "cold": 0.0} and not v["joint"]["met"]
    # a loose TPOT: 9 of 10 warm within 2 s (0.9 attains), warm p90 1.3 + 0.1 * (2.5 - 1.3) = 1.42 s: met
    assert v["ttft"]["attainment"] == {"warm": 0.9, "cold": 1.0}
    assert v["ttft"]["warm_ttft_p90_s"] == pytest.approx(1.42) and v["ttft"]["met"]


def test_goodput_stops_at_the_first_miss():
    pts = {0.05: {"j": {"met": True}}, 0.1: {"j": {"met": False}}, 0.15: {"j": {"met": True}}}
    assert goodputs(pts) == {"j": 0.05}
    assert goodputs({0.05: {"j": {"met": False}}}) == {"j": None}


def test_same_order_counts_ties():
    assert same_order({"a": 0.1, "b": 0.05, "c": 0.05}, {"a": 0.2, "b": 0.1, "c": 0.1})
    assert not same_order({"a": 0.1, "b": 0.05}, {"a": 0.1, "b": 0.1})     # a tie where the other orders
    assert not same_order({"a": 0.1, "b": 0.05}, {"a": 0.05, "b": 0.1})


def test_rankings_take_the_median_over_seeds_and_say_whether_sim_agrees():
    res = {"real": {"x/1": {"goodput": {"joint": 0.1, "ttft": 0.2}}, "x/2": {"goodput": {"joint": None, "ttft": 0.2}},
                    "x/3": {"goodput": {"joint": 0.1, "ttft": 0.15}},
                    "y/1": {"goodput": {"joint": 0.05, "ttft": 0.2}}, "y/2": {"goodput": {"joint": 0.05, "ttft": 0.2}},
                    "y/3": {"goodput": {"joint": 0.05, "ttft": 0.2}}},
           "sim": {f"{a}/{s}": {"goodput": {"joint": 0.1 if a == "x" else 0.05, "ttft": 0.2}}
                   for a in "xy" for s in (1, 2, 3)}}
    r = rankings(res, ["x", "y"], [1, 2, 3])
    assert r["real"]["joint"]["median"] == {"x": 0.1, "y": 0.05} and r["real"]["joint"]["order"] == ["x", "y"]
    assert r["real"]["ttft"]["median"] == {"x": 0.2, "y": 0.2}
    assert r["sim_agrees"] == {"joint": True, "ttft": True} and "plan_agrees" not in r


def test_every_arm_is_pinned_one_worker_per_core_and_has_a_plan_candidate():
    assert {a: t.cpus for a, t in ARMS.items()} == {
        "replica-2": {"replica-0": "0", "replica-1": "1"}, "pd-1p1d": {"prefill-0": "0", "decode-0": "1"},
        "pd-1p1d@dynamic": {"prefill-0": "0", "decode-0": "1"}, "goodput-1p1d": {"prefill-0": "0", "decode-0": "1"}}
    cands = plan_candidates()
    assert {a: cands[c].topology().workers for a, c in CANDIDATES.items()} == {
        a: t.workers for a, t in ARMS.items() if ARMS[a].policy != "goodput"}   # plan's space has no goodput candidate
    assert cands[CANDIDATES["pd-1p1d@dynamic"]].ppd == "dynamic"


def test_only_the_goodput_router_gets_the_joint_target_and_the_calibration(tmp_path):
    from pathlib import Path

    from benchmarks.policies.ranking import router_argv

    t = {"joint": joint_target(0.1108)}
    assert router_argv(ARMS["goodput-1p1d"], t, Path("cal.json")) == (
        "--slo", t["joint"].spec(), "--calibration", "cal.json")
    assert router_argv(ARMS["pd-1p1d@dynamic"], t, Path("cal.json")) == ()


def test_the_served_decode_factor_makes_the_simulated_unloaded_run_the_real_one():
    import statistics
    from pathlib import Path

    from benchmarks.policies.ranking_sim import cpu_setup, served_decode_factor, unloaded_tpots

    cal = Path("benchmarks/results/sim_accuracy/calibration_refit.json")
    base = cpu_setup(cal, 120.0)
    tpots = unloaded_tpots(base, ARMS["replica-2"], 3, 20.0)
    # one sequence decodes at a time: every TPOT is its decode steps' mean, so doubling the decodes
    # doubles every TPOT, and the factor for a real median twice the simulated one is 2
    assert len(tpots) >= 3
    assert unloaded_tpots(cpu_setup(cal, 120.0, 2.0), ARMS["replica-2"], 3, 20.0) == pytest.approx(
        [2 * t for t in tpots], rel=1e-9)
    med = statistics.median(tpots)
    assert served_decode_factor(2 * med, base, ARMS["replica-2"], 3, 20.0) == pytest.approx(2.0, rel=1e-12)
    # the setup's own factor does not enter the measurement (it is measured against the calibration)
    assert served_decode_factor(2 * med, cpu_setup(cal, 120.0, 3.0), ARMS["replica-2"], 3, 20.0) == \
        pytest.approx(2.0, rel=1e-12)


def test_send_times_follow_each_answer_and_requests_pair_by_session_turn():
    from benchmarks.policies.ranking_requests import sends, side_by_side

    def r(sid, e2e, ttft=0.5):
        return {"sid": sid, "e2e_s": e2e, "ttft_s": ttft, "tpot_s": 0.1, "class": "warm", "decode": "d"}

    starts = {"a": 1.0, "b": 2.5}
    # a's second turn is sent when its first answer ends: 1.0 + 3.0
    got = sends([r("a", 3.0), r("b", 1.0), r("a", 2.0)], starts)
    assert [(t, n, x["sid"]) for t, n, x in got] == [(1.0, 1, "a"), (2.5, 1, "b"), (4.0, 2, "a")]
    lines = side_by_side([r("a", 3.0), r("a", 2.0)], [r("a", 2.0), r("a", 1.0), r("b", 1.0)], starts)
    # real a t2 at 4.0 pairs with simulated a t2 at 3.0; b ran only in the simulation
    assert [x.split("|")[0].split() for x in lines] == [["a", "t1"], ["a", "t2"], ["b", "t1"]]
    assert "   4.00" in lines[1].split("|")[1] and "   3.00" in lines[1].split("|")[2]
    assert "not in the real run" in lines[2]


def test_the_sim_takes_the_workers_kv_dtype_and_overlap_from_worker_args():
    from pathlib import Path

    from benchmarks.policies.ranking_sim import cpu_setup, sim_flags

    assert sim_flags(["--kv-dtype", "float16", "--decode-threads", "1", "--kv-l3-overlap=on"]) == [
        "--kv-dtype", "float16", "--kv-l3-overlap", "on"]
    assert sim_flags(["--threads", "1"]) == []
    with pytest.raises(ValueError, match="--kv-dtype needs a value"):
        sim_flags(["--kv-dtype"])
    cal = Path("benchmarks/results/sim_accuracy/calibration_refit.json")
    plain = cpu_setup(cal, 120.0, worker_args=[])
    half = cpu_setup(cal, 120.0, worker_args=["--kv-dtype", "float16", "--kv-l3-overlap", "on"])
    # SmolLM2-135M: 30 layers x 2 x 3 KV heads x 64 x 4 bytes, then x 2 bytes
    assert (plain.model.kv_bytes_per_token, half.model.kv_bytes_per_token) == (46080, 23040)
    assert (plain.l3_overlap, half.l3_overlap) == (False, True)


def test_rotated_starts_each_rate_at_the_next_arm():
    from benchmarks.policies.ranking import rotated

    arms = ["a", "b", "c"]
    assert [rotated(arms, k) for k in (0, 1, 2, 3, 14)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                           ["a", "b", "c"], ["c", "a", "b"]]
    assert rotated([], 5) == []


def test_a_seeds_arms_run_point_by_point_in_rotated_order_and_all_stop(monkeypatch, tmp_path):
    """The schedule only (the clusters are what ``ArmRun`` starts; here a recorder stands in):
    rate by rate, the order rotated by rate index + seed; an arm that missed both targets runs no
    more points; every arm is finished, also when a point fails."""
    from benchmarks.policies import ranking

    calls = []
    misses = {("b", 0.1)}          # b misses both targets at 0.1, so it does not run 0.15

    class Recorder:
        def __init__(self, name, seed, targets, calibration):
            self.name, self.points = name, {}

        @property
        def going(self):
            return not self.points or self.points[max(self.points)]

        def point(self, rate, duration, timeout, encode):
            calls.append((self.name, rate))
            if (self.name, rate) == ("c", 0.15) and fail:
                raise RuntimeError("a point failed")
            self.points[rate] = (self.name, rate) not in misses

        def finish(self, out):
            calls.append((self.name, "finish"))
            if self.name == "a" and finish_fails:
                raise OSError("could not write a's results")
            return {"points": dict(self.points)}

    monkeypatch.setattr(ranking, "ArmRun", Recorder)
    fail = finish_fails = False
    got = ranking.real_seed(["a", "b", "c"], 1, [0.05, 0.1, 0.15], 1.0, 1.0, {}, None, tmp_path, tmp_path)
    assert calls == [("b", 0.05), ("c", 0.05), ("a", 0.05),      # rate 0: rotated by 0 + seed 1
                     ("c", 0.1), ("a", 0.1), ("b", 0.1),
                     ("a", 0.15), ("c", 0.15),                   # b stopped at its miss
                     ("a", "finish"), ("b", "finish"), ("c", "finish")]
    assert got["b"] == {"points": {0.05: True, 0.1: False}}
    calls.clear()
    fail = True
    with pytest.raises(RuntimeError, match="a point failed"):
        ranking.real_seed(["a", "b", "c"], 1, [0.05, 0.1, 0.15], 1.0, 1.0, {}, None, tmp_path, tmp_path)
    assert [c for c in calls if c[1] == "finish"] == [("a", "finish"), ("b", "finish"), ("c", "finish")]
    calls.clear()
    fail, finish_fails = False, True     # one arm's finish fails: the others still stop, then it raises
    with pytest.raises(OSError, match="a's results"):
        ranking.real_seed(["a", "b", "c"], 1, [0.05], 1.0, 1.0, {}, None, tmp_path, tmp_path)
    assert [c for c in calls if c[1] == "finish"] == [("a", "finish"), ("b", "finish"), ("c", "finish")]

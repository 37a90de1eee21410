"""``warmpath plan``: the candidates of a GPU budget, the sustained-load rule, the choice and
its runner-up, the early stop, determinism, and the CLI's errors."""

import json

import pytest

from warmpath.bench.metrics import Record, SLOMissWatch
from warmpath.cli import main
from warmpath.plan.search import PlanConfig, plan, search_load
from warmpath.plan.space import Candidate, candidates


def test_candidates_of_four_gpus_by_hand():
    # replica: 4x tp1, 2x tp2, 1x tp4; PD (tp_p, tp_d): (1,1) 1p3d 2p2d 3p1d, (1,2) 2p1d, (2,1) 1p2d, (2,2) 1p1d;
    # CPD (pre-prefill and prefill share a TP): (1,1) 1+1+2, 1+2+1, 2+1+1; (1,2) 1+1+1d(tp2)
    cs = candidates(4, (1, 2, 4))
    assert [c.name for c in cs] == [
        "replica 4r tp1", "replica 2r tp2", "replica 1r tp4",
        "pd 1p+3d tp1", "pd 2p+2d tp1", "pd 3p+1d tp1", "pd 2p+1d tp1/2", "pd 1p+2d tp2/1", "pd 1p+1d tp2",
        "cpd 1pp+1p+2d tp1", "cpd 1pp+2p+1d tp1", "cpd 2pp+1p+1d tp1", "cpd 1pp+1p+1d tp1/2"]
    assert all(c.gpus == 4 for c in cs)
    assert len(candidates(4, (1, 2, 4), ppd_modes=("off", "x1", "dynamic"))) == 13 + 2 * 6   # PPD on PD only
    # 8 GPUs, TP 1/2/4/8: 4 replica + 21 PD + 40 CPD
    assert len(candidates(8)) == 65
    # a 70B model does not fit one H100: TP 2 and 4 only -> 2x tp2, 1x tp4, PD 1p+1d tp2
    assert [c.name for c in candidates(4, (1, 2, 4), fits=lambda tp: tp >= 2)] == [
        "replica 2r tp2", "replica 1r tp4", "pd 1p+1d tp2"]
    # smaller deployments too: 1..2 GPUs -> replica 1r, 2r, 1r tp2, PD 1p+1d
    assert [c.name for c in candidates(2, (1, 2), min_gpus=1)] == [
        "replica 1r tp1", "replica 2r tp1", "replica 1r tp2", "pd 1p+1d tp1"]
    c = Candidate("cpd", (1, 1, 2), (4, 4, 1))
    assert (c.gpus, c.tp, c.topology().workers) == (10, {"pre-prefill": 4, "prefill": 4, "decode": 1},
                                                    {"pre-prefill": 1, "prefill": 1, "decode": 2})


def test_ppd_on_cpd_and_the_pd_kv_policy_when_asked():
    # 3 GPUs of TP 1: replica 3r; PD 1p+2d and 2p+1d, each under pd and pd-kv, PPD off and dynamic (8);
    # CPD 1pp+1p+1d, PPD off and dynamic (2): the real cluster's cpd-1d, cpd-1d@dynamic, pd-2p1d+pd-kv, replica-3
    cs = candidates(3, (1,), ppd_modes=("off", "dynamic"), ppd_kinds=("pd", "cpd"), pd_policies=("pd", "pd-kv"))
    assert [c.name for c in cs] == [
        "replica 3r tp1", "pd 1p+2d tp1", "pd 1p+2d tp1 ppd-dynamic", "pd 1p+2d tp1 pd-kv",
        "pd 1p+2d tp1 pd-kv ppd-dynamic", "pd 2p+1d tp1", "pd 2p+1d tp1 ppd-dynamic", "pd 2p+1d tp1 pd-kv",
        "pd 2p+1d tp1 pd-kv ppd-dynamic", "cpd 1pp+1p+1d tp1", "cpd 1pp+1p+1d tp1 ppd-dynamic"]
    kv, dyn = cs[7].topology(), cs[10].topology()
    assert (kv.policy, kv.workers, kv.ppd) == ("pd-kv", {"prefill": 2, "decode": 1}, "off")
    assert (dyn.policy, dyn.workers, dyn.ppd) == ("cpd", {"pre-prefill": 1, "prefill": 1, "decode": 1}, "dynamic")
    # the defaults are unchanged: PPD on PD only, the pd policy only
    assert [c.name for c in candidates(3, (1,), ppd_modes=("off", "dynamic"))] == [
        "replica 3r tp1", "pd 1p+2d tp1", "pd 1p+2d tp1 ppd-dynamic", "pd 2p+1d tp1", "pd 2p+1d tp1 ppd-dynamic",
        "cpd 1pp+1p+1d tp1"]
    with pytest.raises(ValueError, match="PPD applies to pd and cpd"):
        candidates(3, (1,), ppd_kinds=("replica",))
    with pytest.raises(ValueError, match="PD policies must be among pd, pd-kv"):
        candidates(3, (1,), pd_policies=("cpd",))
    from warmpath.plan.report import topology_json
    row = {"kind": "pd", "policy": "pd-kv", "ppd": "off", "workers": {"prefill": 2, "decode": 1}}
    assert json.loads(topology_json(row)) == {"policy": "pd-kv", "ppd": "off", "workers": {"prefill": 2, "decode": 1}}


def _met_below(cap: float, seen: list | None = None):
    def at(x: float) -> dict:
        if seen is not None:
            seen.append(x)
        return {"slo_met": x < cap, "rate": x}
    return at


def test_sustained_load_is_every_lower_point_met_then_bisection():
    seen: list = []
    best, runs = search_load(_met_below(3.0, seen), (1.0, 2.0, 4.0, 8.0), bisect=2)
    # up the grid to the first miss (8 never run), then 2 steps between 2 (met) and 4 (missed): 3 misses, 2.5 met
    assert seen == [1.0, 2.0, 4.0, 3.0, 2.5] and best == 2.5
    # a pass above a miss is noise, not capacity: 4 and 8 met but 2 did not
    noisy = {1.0: True, 2.0: False, 4.0: True, 8.0: True}
    best, runs = search_load(lambda x: {"slo_met": noisy[x]}, (1.0, 2.0, 4.0, 8.0), bisect=0)
    assert best == 1.0 and sorted(runs) == [1.0, 2.0]
    assert search_load(_met_below(0.5), (1.0, 2.0), bisect=3)[0] is None   # the lowest load missed
    assert search_load(_met_below(99.0), (1.0, 2.0), bisect=3)[0] == 2.0   # every load met: the top


def _fake(caps: dict, heads: dict | None = None):
    """Each candidate sustains load < caps[name] on the whole load, 20% more on the screen."""
    def evaluate(c: Candidate, x: float, whole: bool) -> dict:
        cap = caps[c.name] * (1.0 if whole else 1.2)
        return {"slo_met": x < cap, "rate": x * c.gpus, "headroom": (heads or {}).get(c.name, 0.5)}
    return evaluate


def test_choice_and_runner_up_from_the_finalists():
    cs = candidates(4, (1, 2, 4), kinds=("replica", "pd"))
    caps = {c.name: 1.5 for c in cs}
    caps.update({"pd 2p+2d tp1": 3.5, "pd 1p+3d tp1": 2.5, "replica 4r tp1": 2.5})
    heads = {"pd 1p+3d tp1": 0.9, "replica 4r tp1": 0.7}
    cfg = PlanConfig(4, (1.0, 2.0, 4.0), finalists=3, bisect=1)
    lines: list = []
    res = plan(cs, _fake(caps, heads), cfg, say=lines.append)
    # screen (caps x1.2, no bisection): 2p2d 4.2 -> 4/GPU... sustained 4.0, 1p3d and 4r 3.0 -> 2.0 each
    # whole load: 2p2d 2.0 then bisect (2, 4) -> 3.0 met; 1p3d and 4r: 2.0, bisect 3.0 missed -> 2.0; tie broken
    # by headroom (0.7 < 0.9)
    assert res["finalists"] == ["pd 2p+2d tp1", "replica 4r tp1", "pd 1p+3d tp1"]
    assert (res["recommended"], res["runner_up"]) == ("pd 2p+2d tp1", "replica 4r tp1")
    top = res["rows"][0]
    assert (top["stage"], top["sustained_load"], top["per_gpu"], top["screen"]["per_gpu"]) == ("full", 3.0, 3.0, 4.0)
    assert [r["stage"] for r in res["rows"]] == ["full"] * 3 + ["screen"] * 6
    assert [p["load"] for p in top["points"]] == [1.0, 2.0, 3.0, 4.0]
    assert len(lines) == 9 + 3 and lines[0].startswith("[screen 1/9] replica 4r tp1: 2 req/s/GPU (")
    # no screen: every candidate on the whole load, with bisection
    res = plan(cs, _fake(caps, heads), PlanConfig(4, (1.0, 2.0, 4.0), screen_requests=0, bisect=1), say=lines.append)
    assert [r["stage"] for r in res["rows"]] == ["full"] * 9 and res["simulations"] == 6 * 3 + 3 * 4
    # nothing met: no recommendation
    res = plan(cs, _fake({c.name: 0.5 for c in cs}), cfg, say=lines.append)
    assert res["recommended"] is None and res["runner_up"] is None


def test_slo_miss_watch_stops_only_when_certain():
    ok = lambda t: Record("s", 1, "cold", True, ttft=t, e2e=t + 1, output_tokens=2)   # noqa: E731
    bad = Record("s", 1, "cold", False, error="HTTP 429")
    w = SLOMissWatch({"ttft_p90": 2.0}, most=100)
    assert not w([bad])                       # 1 failure of 100: 99% can still succeed
    assert w([bad, bad])                      # 2 > 1% of 100
    w = SLOMissWatch({"ttft_p90": 2.0, "tpot": 0.1}, most=100)
    recs = [ok(3.0)] * 10
    assert not w(recs)                        # 10 of 100 miss: 90% can still attain
    assert w(recs + [ok(3.0)])                # 11 > 10% of 100 cannot
    # a per-request TPOT bound: 2 of 10 with TPOT 1 s > 0.1 s -> at most 80% attain
    w = SLOMissWatch({"tpot": 0.1}, most=10)
    assert not w([ok(9.0)]) and w([ok(9.0)] * 2)
    # a median is no per-request bound (p50 < the 90% share) and never stops a run early
    assert not SLOMissWatch({"ttft_p50": 1.0}, most=10)([ok(9.0)] * 5)


def test_sim_plan_is_deterministic_and_writes_its_files(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{i * 0.5},{200 + 40 * (i % 5)},{8 + i % 3}\n" for i in range(24)))
    args = ["plan", "--gpus", "2", "--hardware", "h100", "--trace", str(trace), "--slo", "ttft_p90=0.05,tpot=0.02",
            "--grid", "8,32,128", "--screen-requests", "8", "--bisect", "1"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--jobs", "2"]) == 0
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("wall_s", "cpu_s", "screen")} for r in rows]  # noqa: E731
    a, b = (json.loads((tmp_path / d / "plan.json").read_text()) for d in "ab")
    assert strip(a["rows"]) == strip(b["rows"]) and a["recommended"] == b["recommended"]
    assert a["candidates"] == 3 and {r["candidate"] for r in a["rows"]} == {
        "replica 2r tp1", "replica 1r tp2", "pd 1p+1d tp1"}
    for f in ("plan.csv", "plan.md", "plan.png"):
        assert (tmp_path / "a" / f).stat().st_size > 0
    if a["recommended"]:
        top = json.loads((tmp_path / "a" / "recommended.json").read_text())
        assert top["workers"] == a["rows"][0]["workers"]
    err = capsys.readouterr().err
    assert "[screen 3/3]" in err and "[full 2/2]" in err
    # where each parameter of the simulated GPU comes from: its spec sheet or the fit
    hw = a["profile"]["hardware"]
    assert hw["hbm_bytes_s"] == {"value": 3.35e12, "from": "spec sheet"} and hw["mbu"]["from"] == "fit"
    assert any(x.startswith("max_num_seqs=1024") for x in a["profile"]["from"]["engine"])   # vLLM's on an H100


@pytest.mark.parametrize("extra, message", [
    (["--gpus", "0"], "--gpus must be >= 1, got 0"),
    (["--gpus", "4", "--grid", "2,1"], "--grid must be loads > 0 in ascending order"),
    (["--gpus", "4", "--tp-set", "1,x"], "--tp-set: expected comma-separated integers"),
    (["--gpus", "4", "--kinds", "pd,xpd"], "--kinds must be among replica, pd, cpd"),
    (["--gpus", "4", "--ppd-kinds", "replica"], "--ppd-kinds must be among pd, cpd"),
    (["--gpus", "4", "--pd-policies", "pd,cpd"], "--pd-policies must be among pd, pd-kv"),
    (["--gpus", "4", "--slo", "ttft_p42=1"], "--slo: expected KEY=SECONDS"),
    (["--gpus", "1", "--model", "llama-3.1-70b"], "no topology fits 1 GPUs"),
])
def test_cli_errors_name_the_problem(tmp_path, capsys, extra, message):
    trace = tmp_path / "t.csv"
    trace.write_text("0,100,4\n1,100,4\n")
    slo = [] if "--slo" in extra else ["--slo", "ttft_p90=2"]
    assert main(["plan", "--trace", str(trace), *slo, *extra]) == 2
    assert message in capsys.readouterr().err


def test_cli_unknown_hardware_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--gpus", "4", "--hardware", "h999", "--workload", "coding-agent", "--slo", "ttft_p90=2"])
    assert "--hardware: invalid choice: 'h999'" in capsys.readouterr().err


def test_ppd_modes_only_where_sessions_have_turns_two_and_up(tmp_path):
    import argparse

    from warmpath.plan.cli import add_parser, build

    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    trace = tmp_path / "t.csv"
    trace.write_text("0,100,4\n1,100,4\n")
    common = ["plan", "--gpus", "2", "--slo", "ttft_p90=2"]
    *_, cands, _, _, modes = build(p.parse_args([*common, "--workload", "ppd-grid"]))
    assert modes == ("off", "x1", "dynamic") and [c.name for c in cands] == [
        "replica 2r tp1", "replica 1r tp2", "pd 1p+1d tp1", "pd 1p+1d tp1 ppd-x1", "pd 1p+1d tp1 ppd-dynamic"]
    *_, cands, _, _, modes = build(p.parse_args([*common, "--trace", str(trace)]))
    assert modes == ("off",) and len(cands) == 3   # one-turn requests: PPD changes nothing


def test_replicas_are_always_candidates():
    """Replicas are in every comparison: ``--kinds pd,cpd`` still tries them."""
    assert PlanConfig(4, (1.0,), kinds=("pd", "cpd")).kinds == ("replica", "pd", "cpd")
    assert PlanConfig(4, (1.0,), kinds=("replica",)).kinds == ("replica",)

"""The routers comparison judged again from requests.jsonl: hand-made runs, exact goodputs."""

import json

from benchmarks.peers.routers_report import report, targets


def _rows(rate: float, n: int, ttft: float, tpot: float) -> list[dict]:
    # 11 output tokens: TPOT = (e2e - ttft) / 10
    return [{"rate": rate, "sid": f"s{rate}-{i}", "turn": 2, "class": "warm", "ok": True, "error": None,
             "ttft_s": ttft, "e2e_s": ttft + 10 * tpot, "output_tokens": 11, "prompt_tokens": 100,
             "cached_tokens": 90} for i in range(n)]


def _run(root, router: str, points: dict) -> None:
    d = root / router / "seed0"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"runs": {str(r): {"duration_s": 10.0} for r in points}}))
    rows = [row for r, (ttft, tpot) in points.items() for row in _rows(r, 10, ttft, tpot)]
    (d / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))


def test_targets_scale_the_unloaded_tpot():
    t = targets(0.02)
    assert t["joint"].spec() == "tpot_p90=0.03,cold.ttft_p90=20,warm.ttft_p90=2"
    assert t["joint-3x"].spec() == "tpot_p90=0.06,cold.ttft_p90=20,warm.ttft_p90=2"
    assert t["ttft"].spec() == "cold.ttft_p90=20,warm.ttft_p90=2"


def test_goodput_per_target_and_ratio_to_the_better_peer(tmp_path):
    # warmpath: 0.1 meets all three; 0.2 misses only the joint TPOT (0.05 > 0.03)
    _run(tmp_path, "warmpath", {0.1: (0.5, 0.025), 0.2: (0.5, 0.05)})
    # smg: 0.1 misses the joint TPOT; 0.2 misses warm TTFT (3 s > 2 s)
    _run(tmp_path, "smg", {0.1: (0.5, 0.05), 0.2: (3.0, 0.05)})
    runs = [{"router": r, "seed": 0, "prefix_cache": {"hit_rate": h}} for r, h in (("warmpath", 0.6), ("smg", 0.5))]
    (tmp_path / "routers.json").write_text(json.dumps({"unloaded_tpot_s": 0.02, "runs": runs}))
    rep = report(tmp_path)
    assert rep["routers"]["warmpath"]["seeds"][0]["goodput"] == {"joint": 0.1, "joint-3x": 0.2, "ttft": 0.2}
    assert rep["routers"]["smg"]["seeds"][0]["goodput"] == {"joint": None, "joint-3x": 0.1, "ttft": 0.1}
    assert rep["routers"]["smg"]["median_goodput"] == {"joint": 0.0, "joint-3x": 0.1, "ttft": 0.1}
    assert rep["warmpath_vs_best_peer"] == {"joint": None, "joint-3x": 2.0, "ttft": 2.0}
    assert rep["routers"]["warmpath"]["median_hit_rate"] == 0.6


def test_each_warmpath_arm_against_the_better_peer(tmp_path):
    # warmpath (replicas): joint 0.1; warmpath-pd: joint 0.2 (both rates met); smg: joint 0.1
    _run(tmp_path, "warmpath", {0.1: (0.5, 0.025), 0.2: (0.5, 0.05)})
    _run(tmp_path, "warmpath-pd", {0.1: (0.5, 0.025), 0.2: (0.5, 0.025)})
    _run(tmp_path, "smg", {0.1: (0.5, 0.025), 0.2: (3.0, 0.05)})
    runs = [{"router": r, "seed": 0, "prefix_cache": {"hit_rate": 0.5}} for r in ("warmpath", "warmpath-pd", "smg")]
    (tmp_path / "routers.json").write_text(json.dumps({"unloaded_tpot_s": 0.02, "runs": runs}))
    rep = report(tmp_path)
    assert rep["warmpath_arms_vs_best_peer"] == {"warmpath": {"joint": 1.0, "joint-3x": 2.0, "ttft": 2.0},
                                                 "warmpath-pd": {"joint": 2.0, "joint-3x": 2.0, "ttft": 2.0}}
    assert rep["warmpath_vs_best_peer"] == {"joint": 1.0, "joint-3x": 2.0, "ttft": 2.0}

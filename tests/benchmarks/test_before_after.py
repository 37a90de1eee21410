"""benchmarks/policies/before_after.py: goodput per label and seed from real_policies' request
records, under the TTFT-only and the joint target, by hand (no cluster)."""

import json

import pytest

from benchmarks.policies.before_after import main, median_or_none, targets


def row(rate, cls, ttft, tpot):
    """A requests.jsonl row of a 33-token answer whose TPOT is ``tpot``."""
    return {"rate": rate, "sid": f"s{rate}-{ttft}", "turn": 1, "class": cls, "ok": True, "ttft_s": ttft,
            "e2e_s": ttft + 32 * tpot, "output_tokens": 33, "prompt_tokens": 100, "cached_tokens": 0,
            "error": None}


def write(tmp_path, name, rows):
    d = tmp_path / name / "cpd-1d"
    d.mkdir(parents=True)
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_joint_target_adds_a_tpot_bound_to_the_cluster_target():
    t = targets(0.1)
    assert t["ttft"].spec() == "cold.ttft_p90=20,warm.ttft_p90=2"
    assert t["joint"].bounds("all").tpot_p90 == pytest.approx(0.1)
    assert t["joint"].bounds("warm").ttft_p90 == 2.0 and t["joint"].bounds("cold").ttft_p90 == 20.0


def test_goodput_per_seed_and_median(tmp_path, capsys):
    fast = [row(0.1, "warm", 0.4, 0.05), row(0.1, "cold", 8.0, 0.05),
            row(0.2, "warm", 0.5, 0.05), row(0.2, "cold", 9.0, 0.06)]
    # slow decodes: 0.2 s per token at 0.2 misses the joint target, not the TTFT-only one;
    # a 3 s warm TTFT at 0.3 misses both
    slow = [row(0.1, "warm", 0.4, 0.08), row(0.1, "cold", 8.0, 0.09),
            row(0.2, "warm", 0.5, 0.2), row(0.2, "cold", 9.0, 0.2), row(0.3, "warm", 3.0, 0.05)]
    write(tmp_path, "before_s1", slow)
    write(tmp_path, "before_s2", slow)
    write(tmp_path, "after_s1", fast)
    write(tmp_path, "after_s2", fast[:2] + [row(0.2, "warm", 2.5, 0.05)])   # seed 2 misses at 0.2
    assert main(["--dir", str(tmp_path), "--labels", "before,after", "--seeds", "1,2"]) == 0
    out = json.loads((tmp_path / "before_after.json").read_text())
    assert out["runs"]["before_s1"]["goodput"] == {"ttft": 0.2, "joint": 0.1}
    assert out["runs"]["after_s1"]["goodput"] == {"ttft": 0.2, "joint": 0.2}
    assert out["runs"]["after_s2"]["goodput"] == {"ttft": 0.1, "joint": 0.1}
    assert out["median"]["before"] == {"ttft": 0.2, "joint": 0.1}
    assert out["median"]["after"] == {"ttft": pytest.approx(0.15), "joint": pytest.approx(0.15)}
    assert "| before | 0.2 / 0.2 → **0.2** | 0.1 / 0.1 → **0.1** |" in capsys.readouterr().out


def test_a_missing_run_is_named(tmp_path, capsys):
    assert main(["--dir", str(tmp_path), "--labels", "before", "--seeds", "7"]) == 2
    assert "before_s7/cpd-1d/requests.jsonl not found" in capsys.readouterr().err


def test_median_counts_a_seed_that_met_nothing_as_zero():
    assert median_or_none([0.2, None, 0.1]) == 0.1
    assert median_or_none([None, None]) is None

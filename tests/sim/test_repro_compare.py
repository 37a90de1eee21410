"""``sim/repro_compare.py``: the seed-vs-ours rows, worked by hand."""

from warmpath.sim.repro_compare import cpd_rows, markdown, ppd_rows, saturation_rate

CPD_TABLE = {
    "2P1D": {"achieved_qps_per_gpu": {"0.4": 0.4, "0.8": 0.76, "1.2": 0.78},
             "ttft_p50_s": {"0.4": 0.2, "0.8": 1.5, "1.2": 6.0}},
    "CPD-1D": {"achieved_qps_per_gpu": {"0.4": 0.4, "0.8": 0.8, "1.2": 1.12},
               "ttft_p50_s": {"0.4": 0.1, "0.8": 0.3, "1.2": 0.9}},
    "gain_CPD-1D_vs_2P1D": 0.5}


def test_saturation_is_the_first_rate_at_95_percent_of_the_plateau():
    assert saturation_rate({"0.4": 0.4, "0.8": 0.76, "1.2": 0.78}) == "0.8"     # 0.76 >= 0.741
    assert saturation_rate({"0.4": 0.4, "0.8": 0.8, "1.2": 1.12}) == "1.2"      # 0.8 < 1.064
    assert saturation_rate({}) is None


def test_cpd_rows():
    got = [(r["point"], r["metric"], r["seed"], round(r["ours"], 6), r["within"]) for r in cpd_rows(CPD_TABLE)]
    assert got == [
        ("2P1D", "plateau QPS/GPU (highest achieved)", "0.75 to 0.8 QPS/GPU", 0.78, True),
        ("2P1D @ 0.8", "TTFT p50 where saturated", "> 1 s", 1.5, True),
        ("CPD-1D", "plateau QPS/GPU (highest achieved)", "1.1 to 1.15 QPS/GPU", 1.12, True),
        ("CPD-1D @ 1.2", "TTFT p50 where saturated", "0 to 3 s", 0.9, True),
        ("CPD-1D vs 2P1D", "plateau gain", "+35% to +40%", round(1.12 / 0.78 - 1, 6), False)]   # +43.6%


def _p(ttft):
    return {"turn2_ttft_p50_s": ttft}


def test_ppd_rows_per_point_mean_and_bandwidth():
    table = {"4.0/1P3D-x0": _p(0.100), "4.0/1P3D-x1": _p(0.040), "4.0/1P3D-dynamic": _p(0.030),
             "12.0/1P3D-x0": _p(0.200), "12.0/1P3D-x1": _p(0.020), "12.0/1P3D-dynamic": _p(0.060)}
    sweep = {"25": {"PD": 0.1706, "PPD": 0.060}, "400": {"PD": 0.140, "PPD": 0.050}}
    got = [(r["point"], r["metric"], round(r["ours"], 6), r["within"]) for r in ppd_rows(table, sweep)]
    assert got == [
        ("4.0/1P3D", "x1 turn-2 TTFT p50 vs x=0", -0.6, True),
        ("4.0/1P3D", "dynamic turn-2 TTFT p50 vs x=0", -0.7, True),          # within 10% of -68%
        ("12.0/1P3D", "x1 turn-2 TTFT p50 vs x=0", -0.9, False),
        ("12.0/1P3D", "dynamic turn-2 TTFT p50 vs x=0", -0.7, True),
        ("mean of 2", "x1 turn-2 TTFT p50 vs x=0", -0.75, False),
        ("mean of 2", "dynamic turn-2 TTFT p50 vs x=0", -0.7, True),
        ("400 Gb/s", "PD turn-2 TTFT p50", 140.0, False),                    # under 143.7
        ("400 Gb/s", "PPD turn-2 TTFT p50", 50.0, True),
        ("25 Gb/s", "PD turn-2 TTFT p50", 170.6, True),
        ("25 Gb/s", "PPD turn-2 TTFT p50", 60.0, False)]                     # 51 +- 5.1


def test_markdown():
    rows = ppd_rows({"4.0/2P2D-x0": _p(0.1), "4.0/2P2D-x1": _p(0.05)})
    assert markdown(rows).splitlines() == [
        "| point | metric | seed | ours | within |", "|---|---|---|---|---|",
        "| 4.0/2P2D | x1 turn-2 TTFT p50 vs x=0 | -73% to -48% | -50% | yes |",
        "| mean of 1 | x1 turn-2 TTFT p50 vs x=0 | -73% to -48% | -50% | yes |"]

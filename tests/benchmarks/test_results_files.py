"""benchmarks/common: gzipped result files read like plain ones, and a run's report.html
rebuilt from what the results tree keeps is the page ``warmpath bench`` writes."""

import gzip
import json

from benchmarks.common.results import main as report_main, page, read_json, read_text
from warmpath.bench.report import write_report


def test_read_json_takes_plain_gzipped_and_the_gz_of_a_missing_name(tmp_path):
    data = {"samples": [{"t": 0, "values": {"rss_mib/router": 98.5}}], "verdict": {"goal_met": True}}
    (tmp_path / "plain.json").write_text(json.dumps(data))
    with gzip.open(tmp_path / "packed.json.gz", "wt") as f:
        json.dump(data, f)
    assert read_json(tmp_path / "plain.json") == data
    assert read_json(tmp_path / "packed.json.gz") == data
    assert read_json(tmp_path / "packed.json") == data          # only packed.json.gz exists
    assert read_text(tmp_path / "packed.json.gz") == json.dumps(data)


def _run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    summary = {"target": "http://127.0.0.1:8300", "workload": "coding-agent", "max_rate_meeting_slo": 0.1,
               "rates": {"0.1": {"all": {"completed": 5, "failed": 0, "ttft_p50_s": 0.5}}},
               "runs": {"0.1": {"achieved_rps": 0.1, "duration_s": 60.0}}}
    (run / "summary.json").write_text(json.dumps(summary))
    for name in ("ppd_turn2.png", "cpd_fig4.png"):
        (run / name).write_bytes(b"\x89PNG\r\n\x1a\n" + name.encode())
    return run, summary


def test_report_page_is_what_warmpath_bench_writes(tmp_path):
    run, summary = _run(tmp_path)
    want = write_report(tmp_path / "bench", summary, [run / "cpd_fig4.png", run / "ppd_turn2.png"],
                        "warmpath bench: http://127.0.0.1:8300").read_text()
    assert page(run) == want
    assert report_main([str(run)]) == 0
    assert (run / "report.html").read_text() == want


def test_pack_gzips_large_json_and_logs_and_leaves_out_what_is_drawn_again(tmp_path):
    from benchmarks.common.results import pack, read_jsonl, stored

    big = "".join(json.dumps({"sid": f"s{i}", "ttft_s": i / 7}) + "\n" for i in range(2000))      # > 16 KiB
    calibration = json.dumps({"profile": list(range(20000))})
    files = {"run/requests.jsonl": big, "run/summary.json": json.dumps({"rates": {}}), "run/server.log": big,
             "run/calibration.json": calibration, "run/repro.json": calibration, "run/kept.json": calibration,
             "run/notes.md": "x" * 40000, "run/results.csv": "rate,class\n", "run/report.html": "<html>",
             "run/cpd_fig4.png": "png", "map/cells.jsonl": big, "map/map.json": calibration}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    done = {p.relative_to(tmp_path).as_posix(): action for p, action, _, _ in pack(tmp_path, (tmp_path / "run/kept.json",))}
    assert done == {"run/requests.jsonl.gz": "gzip", "run/server.log.gz": "gzip", "map/map.json.gz": "gzip",
                    "run/results.csv": "drop", "run/report.html": "drop", "run/cpd_fig4.png": "drop",
                    "map/cells.jsonl": "drop"}
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["map/map.json.gz", "run/calibration.json", "run/kept.json", "run/notes.md", "run/repro.json",
                    "run/requests.jsonl.gz", "run/server.log.gz", "run/summary.json"]
    assert read_jsonl(tmp_path / "run/requests.jsonl")[1999] == {"sid": "s1999", "ttft_s": 1999 / 7}
    assert read_json(tmp_path / "map/map.json") == json.loads(calibration)
    assert stored(tmp_path / "run/summary.json") == tmp_path / "run/summary.json"
    assert stored(tmp_path / "run/requests.jsonl") == tmp_path / "run/requests.jsonl.gz"
    assert stored(tmp_path / "run/absent.json") is None
    again = (tmp_path / "run/requests.jsonl.gz").read_bytes()
    (tmp_path / "run/requests.jsonl").write_text(big)
    pack(tmp_path)
    assert (tmp_path / "run/requests.jsonl.gz").read_bytes() == again      # same bytes, same file


def _bench_summary(target="http://127.0.0.1:8300"):
    rates = {}
    for r in ("0.1", "0.2"):
        cls = {"ttft_p50_s": 0.5, "ttft_p90_s": 0.9, "prompt_tokens": 4000, "tpot_s": 0.03, "completed": 5,
               "failed": 0}
        rates[r] = {c: dict(cls) for c in ("all", "warm", "cold", "turn2+")}
    return {"target": target, "workload": "coding-agent", "rates": rates,
            "runs": {r: {"achieved_rps": float(r), "duration_s": 60.0} for r in rates}}


def test_a_runs_page_without_its_plots_draws_them_as_warmpath_bench_did(tmp_path):
    from benchmarks.common.results import draw
    from warmpath.bench.plots import plot_summaries

    run = tmp_path / "run"
    run.mkdir()
    summary = _bench_summary()
    (run / "summary.json").write_text(json.dumps(summary))
    bench = tmp_path / "bench"
    want = write_report(bench, summary, plot_summaries({summary["target"]: summary}, bench),
                        "warmpath bench: http://127.0.0.1:8300").read_text()
    assert page(run) == want                                       # no PNG kept: drawn again
    assert [p.name for p in draw(run)] == ["cpd_fig4.png", "ppd_turn2.png"]
    assert (run / "cpd_fig4.png").read_bytes() == (bench / "cpd_fig4.png").read_bytes()
    assert report_main(["--plots", str(run), "--out-root", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / run / "ppd_turn2.png").exists()


def test_draw_takes_a_real_policies_folder_by_its_configs(tmp_path):
    from benchmarks.common.results import draw
    from warmpath.bench.plots import plot_summaries

    folder = tmp_path / "cluster"
    configs = ["cpd-1d", "benchmarks/topologies/replica-3.json", "peer:smg"]
    sums = {t: _bench_summary(t) for t in configs}
    for t, d in zip(configs, ("cpd-1d", "replica-3", "peer-smg")):
        (folder / d).mkdir(parents=True)
        with gzip.open(folder / d / "summary.json.gz", "wt") as f:
            json.dump(sums[t], f)
    (folder / "cluster.json").write_text(json.dumps({"cpd": {"configs": configs}}))
    assert [p.name for p in draw(folder)] == ["cpd_fig4.png", "ppd_turn2.png"]
    want = plot_summaries(sums, tmp_path / "want")
    assert [p.read_bytes() for p in want] == [(folder / p.name).read_bytes() for p in want]

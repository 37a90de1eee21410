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

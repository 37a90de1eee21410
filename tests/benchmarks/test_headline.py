"""docs/benchmarks.md's headline table says what its result files say: every number (and
each baseline with a reference) equals the value at the cited JSON key path, at the printed
rounding. The checker itself is tested on hand-made files so that a wrong number fails."""

import gzip
import json
from pathlib import Path

import pytest

from benchmarks.common.headline import Printed, Row, agrees, check, lookup, parse_number, table_rows

REPO = Path(__file__).resolve().parents[2]


def test_every_headline_number_comes_from_its_result_file():
    rows = table_rows((REPO / "docs/benchmarks.md").read_text())
    assert 8 <= len(rows) <= 12
    problems = [p for row in rows for p in check(row, REPO)]
    assert problems == []
    for row in rows:
        assert all(path.startswith("benchmarks/results/") for path, _ in row.refs), row.claim
        assert row.command.startswith("`") and row.date[:2] == "20", row.claim


def test_parse_number_reads_the_printed_rounding():
    assert parse_number("**27.6×** faster") == Printed(27.6, 1, False)
    assert parse_number("**−29%**") == Printed(-29.0, 0, True)
    assert parse_number("100,074 requests") == Printed(100074.0, 0, False)
    assert parse_number("PD warm p50 16.19 s") == Printed(16.19, 2, False)     # not the 50 of "p50"
    assert parse_number("p99 0.731 ms") == Printed(0.731, 3, False)
    with pytest.raises(ValueError):
        parse_number("none")


def test_agrees_rounds_the_value_as_printed():
    assert agrees(Printed(27.6, 1, False), 27.553644)
    assert not agrees(Printed(27.5, 1, False), 27.553644)
    assert agrees(Printed(3.0, 1, True), 0.030354)              # a share printed as a percentage
    assert not agrees(Printed(3.0, 1, True), 0.0304 + 0.001)
    assert agrees(Printed(-29.0, 0, True), -0.2922)
    assert not agrees(Printed(0.0, 0, False), True)             # a flag is not a number
    assert not agrees(Printed(1.0, 0, False), "1")


def test_lookup_walks_names_quoted_keys_and_indices():
    data = {"cpd": {"rate": {"cpd-1d": 0.25, "0.1": 3}}, "rows": [{"x": 1}, {"x": 2}], "a/b": {"n": 5}}
    assert lookup(data, 'cpd.rate["cpd-1d"]') == 0.25
    assert lookup(data, 'cpd.rate["0.1"]') == 3
    assert lookup(data, "rows[1].x") == 2
    assert lookup(data, '["a/b"].n') == 5
    with pytest.raises(KeyError):
        lookup(data, "cpd.missing")


TABLE = """# Benchmarks

| claim | number | baseline | command | date | result |
|---|---|---|---|---|---|
| a speed-up | **{n}×** | recompute {b} s | `python -m x` | 2026-12-01 | `r.json.gz` · `speedup`<br>`r.json.gz` · `base["s"]` |

after the table
"""


def test_a_wrong_number_or_baseline_or_key_fails(tmp_path):
    with gzip.open(tmp_path / "r.json.gz", "wt") as f:
        json.dump({"speedup": 27.553, "base": {"s": 10.6149}}, f)
    good = table_rows(TABLE.format(n="27.6", b="10.61"))
    assert len(good) == 1 and good[0].refs == (("r.json.gz", "speedup"), ("r.json.gz", 'base["s"]'))
    assert check(good[0], tmp_path) == []
    assert len(check(table_rows(TABLE.format(n="27.5", b="10.61"))[0], tmp_path)) == 1
    assert len(check(table_rows(TABLE.format(n="27.6", b="10.62"))[0], tmp_path)) == 1
    assert check(table_rows(TABLE.format(n="28", b="10.6"))[0], tmp_path) == []      # fewer decimals, rounded
    assert len(check(table_rows(TABLE.format(n="27", b="10.6"))[0], tmp_path)) == 1   # round(27.553) is 28
    missing = Row("c", "1", "", "`x`", "2026-12-01", (("r.json.gz", "nope"),))
    assert "KeyError" in check(missing, tmp_path)[0]
    gone = Row("c", "1", "", "`x`", "2026-12-01", (("absent.json", "x"),))
    assert "absent.json" in check(gone, tmp_path)[0]


def test_a_table_without_references_is_refused():
    with pytest.raises(ValueError):
        table_rows(TABLE.replace("`r.json.gz` · `speedup`<br>`r.json.gz` · `base[\"s\"]`", "see the docs"))
    with pytest.raises(ValueError):
        table_rows("# no table here\n")

"""bench.suite_times: per-file seconds from pytest's JUnit XML."""

from __future__ import annotations

from pathlib import Path

from bench.suite_times import main, per_file

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3" time="12.5">
<testcase classname="tests.test_a" name="test_one" time="2.0"/>
<testcase classname="tests.test_a.TestGroup" name="test_two" time="3.5"/>
<testcase classname="tests.test_b" name="test_three" time="1.25"/>
</testsuite></testsuites>"""


def test_seconds_are_summed_per_file_classes_included(tmp_path: Path) -> None:
    (tmp_path / "quick.xml").write_text(XML)
    files, wall, tests = per_file(tmp_path / "quick.xml")
    assert files == {"test_a.py": 5.5, "test_b.py": 1.25} and wall == 12.5 and tests == 3


def test_the_table_has_a_column_per_run_and_the_walls(tmp_path: Path, capsys) -> None:
    (tmp_path / "quick.xml").write_text(XML)
    (tmp_path / "slow.xml").write_text(XML.replace('time="1.25"', 'time="40.0"').replace('time="12.5"', 'time="50"'))
    assert main([str(tmp_path / "quick.xml"), str(tmp_path / "slow.xml"), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "| test_b.py | 1.2 | 40.0 | 41.2 |" in out  # the heaviest file first
    assert "| 1 other files | 5.5 | 5.5 | 11.0 |" in out and "**12** | **50** | **62**" in out


def test_a_missing_report_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "none.xml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1

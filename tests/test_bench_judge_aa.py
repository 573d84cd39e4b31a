"""bench.judge_aa and bench.judge_power: the judge against itself and against a faster kernel, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import judge_aa


@pytest.mark.slow
def test_judge_aa_reports_each_machine_and_clock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert judge_aa.main(["--runs", "1", "--out-dir", str(tmp_path)]) == 0
    [md] = tmp_path.glob("*-cpu-interpreter-judge-aa.md")
    rows = [line for line in md.read_text().splitlines() if line.startswith("| rmsnorm |")]
    assert [r.split(" | ")[1:3] for r in rows] == [
        ["idle", "replayer CPU time"], ["idle", "judge wall clock"],
        ["2 busy loops", "replayer CPU time"], ["2 busy loops", "judge wall clock"]]
    assert "accepted (lower bound > 1.03)" in md.read_text() and "run 1/1" in capsys.readouterr().out


@pytest.mark.slow
def test_judge_power_reports_both_machines_with_confirmation_on_and_off(tmp_path: Path) -> None:
    from bench import judge_power

    assert judge_power.main(["--runs", "1", "--out-dir", str(tmp_path)]) == 0
    [md] = tmp_path.glob("*-cpu-interpreter-judge-power.md")
    rows = [line.split(" | ") for line in md.read_text().splitlines() if line.startswith(("| idle", "| 2 busy"))]
    assert [(r[0].strip("| "), r[1]) for r in rows] == [("idle", "off"), ("idle", "on"), ("2 busy loops", "off"),
                                                         ("2 busy loops", "on")]
    assert all(int(r[-1].strip(" |")) == 1 for r in rows), rows  # a 1.7x kernel is accepted, even under load

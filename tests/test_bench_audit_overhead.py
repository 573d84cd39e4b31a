"""The audit-overhead benchmark runs end to end at a tiny size and writes its table (no timing asserted)."""

from __future__ import annotations

from bench.audit_overhead import main


def test_the_bench_runs_and_writes_its_table(embedded_model_dir, tmp_path) -> None:
    assert main(["--rates", "1", "--rounds", "1", "--requests", "2", "--max-tokens", "2",
                 "--model", str(embedded_model_dir), "--out-dir", str(tmp_path)]) == 0
    (report,) = tmp_path.glob("*-audit-overhead.md")
    text = report.read_text()
    assert "slowdown vs rate 1" in text and "| 1.00 |" in text and "1.000x" in text

"""`agent report`: roofline labels with meaningful digits, interpreter figures labelled
as such, what the registry served (not every accepted candidate), gate / registry / tune-run sections,
a default output folder outside the working directory, and a headless-browser screenshot."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from kernelloop.history import History, charts
from kernelloop.history.report import CELL_BADGE, INTERPRETER_BADGE, REPORT_NAME, collect, render

from tests.test_history import PROFILE
from tests.test_report import fill, run_report

ROOT = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BAR_BLUE, ACCEPTED_GREEN = (0x3B, 0x6E, 0xA5), (0x2E, 0x7D, 0x32)
# the interpreter's figures as a first hour on the CPU gives them: roofline fractions far below 0.1%
INTERPRETER_ROWS = [
    {"name": "fused_add_rmsnorm", "kind": "op", "calls": 10, "total_s": 0.5, "share": 0.25, "roofline_pct": 0.00042},
    {"name": "decode_attention", "kind": "op", "calls": 10, "total_s": 1.0, "share": 0.5, "roofline_pct": 0.000075},
    {"name": "silu_mul", "kind": "op", "calls": 10, "total_s": 0.2, "share": 0.0004, "roofline_pct": 0.0011},
]
INTERPRETER_PROFILE = {**PROFILE, "ttft_ms_median": 150_000.0, "tokens_per_second": 0.13, "rows": INTERPRETER_ROWS}


@pytest.fixture
def figures(monkeypatch) -> list[Figure]:
    """The matplotlib figures the charts draw (captured as they are turned into PNG)."""
    drawn: list[Figure] = []
    real = charts._png
    monkeypatch.setattr(charts, "_png", lambda fig: drawn.append(fig) or real(fig))
    return drawn


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [fig._suptitle.get_text() if fig._suptitle else ""]


@pytest.mark.parametrize("value, shown", [(0.00042, "0.00042%"), (0.000075, "0.000075%"), (0.0011, "0.0011%"),
                                          (12.5, "12.5%"), (40.0, "40.0%"), (0.5, "0.50%"), (0.0, "0%")])
def test_percentages_keep_significant_digits(value, shown):
    assert charts.format_pct(value) == shown


def test_roofline_bars_of_the_interpreter_are_labelled_with_digits_and_as_interpreter(figures):
    assert charts.roofline(INTERPRETER_PROFILE)[:8] == b"\x89PNG\r\n\x1a\n"
    labels = texts(figures[-1])
    assert {"0.0011%", "0.00042%", "0.000075%"} <= set(labels) and "0.0%" not in labels
    assert charts.INTERPRETER_NOTE in labels
    ticks = [t.get_text() for t in figures[-1].axes[0].get_xticklabels()]
    assert len(set(ticks)) == len(ticks) > 2  # tick labels tell the ticks apart
    # the same figures from a GPU carry no interpreter note; percentages are not rescaled
    charts.roofline({**INTERPRETER_PROFILE, "device": "NVIDIA H200 sm90",
                     "rows": [{**INTERPRETER_ROWS[0], "roofline_pct": 62.5}]})
    assert "62.5%" in texts(figures[-1]) and charts.INTERPRETER_NOTE not in texts(figures[-1])
    charts.time_shares(INTERPRETER_PROFILE)
    assert "0.040%" in texts(figures[-1]) and charts.INTERPRETER_NOTE in texts(figures[-1])


def event(kind: str, entry: str, at: str, speedup: float | None = None, op: str = "rmsnorm", bucket: str = "b") -> dict:
    return {"kind": kind, "op": op, "entry_id": entry, "created_at": f"2025-01-01T{at}+00:00", "speedup": speedup,
            "device": "cpu-interpreter", "dtype": "float32", "bucket": bucket}


def test_served_series_follows_adds_and_rollbacks_not_accepted_candidates():
    events = [event("add", "A", "10:00:00", 1.2), event("reload", "A", "10:00:01"),
              event("add", "B", "11:00:00", 1.1),  # timed against A: 1.32x over the op's own kernel
              event("add", "C", "11:30:00", 1.5, bucket="other"),  # another slot, its own line
              event("rollback", "B", "12:00:00"), event("rollback", "A", "13:00:00"),
              event("rollback", "unknown", "14:00:00")]
    series, value_of = charts.served_series(events)
    steps = series[("rmsnorm", "cpu-interpreter", "float32", "b")]
    assert [(t[11:19], round(v, 6), k) for t, v, k in steps] == [
        ("10:00:00", 1.2, "add"), ("11:00:00", 1.32, "add"), ("12:00:00", 1.2, "rollback"), ("13:00:00", 1.0, "rollback")]
    assert [v for _, v, _ in series[("rmsnorm", "cpu-interpreter", "float32", "other")]] == [1.5]
    assert value_of["B"] == pytest.approx(1.32)


def test_served_chart_draws_steps_for_commits_and_loose_points_for_accepted(figures):
    events = [event("add", "A", "10:00:00", 1.2), event("rollback", "A", "12:00:00")]
    accepted = [{"op": "rmsnorm", "device": "cpu-interpreter", "created_at": f"2025-01-01T{t}+00:00", "speedup": s,
                 "speedup_lo": s - 0.1, "speedup_hi": s + 0.1, "baseline": b}
                for t, s, b in (("09:59:00", 1.2, "the op's baseline kernel"), ("10:30:00", 1.5, "registry A"),
                                ("11:00:00", 1.1, "registry A"))]
    assert charts.served_over_time(events, accepted)[:8] == b"\x89PNG\r\n\x1a\n"
    ax = figures[-1].axes[0]
    served = [line for line in ax.get_lines() if line.get_label().endswith(": served")]
    assert len(served) == 1 and list(served[0].get_ydata())[:2] == [1.2, 1.0]  # never 1.5 or 1.1: not committed
    loose = [c for c in ax.containers if c.get_label().endswith("accepted by the sandbox")]
    assert len(loose) == 1 and loose[0].lines[0].get_linestyle() == "None"  # points, not a line joining them
    assert [round(y, 6) for y in loose[0].lines[0].get_ydata()] == [1.2, 1.8, 1.32]  # over the op's own kernel
    assert charts.INTERPRETER_NOTE in texts(figures[-1])


def test_report_sections_gates_registry_runs_and_interpreter_labels(tmp_path):
    path = tmp_path / "h.db"
    fill(path)
    with History(path) as h:
        h.record_profile(INTERPRETER_PROFILE)
        page = render(collect(h))
    gates = page.split("<h2>End-to-end gate results</h2>")[1].split("<h2>")[0]
    assert gates.count("<tr>") == 3 and "greedy same" in gates and "2e-07 → 1e-06" in gates and "2e-07 → 0.5" in gates
    assert "1.040x [0.990, 1.090]" in gates and "0.13 → 0.135" in gates and ">no<" in gates and ">yes<" in gates
    assert '<span class="bad">failed</span>' in gates and "KL 0.5 &gt; 0.01" in gates and CELL_BADGE in gates
    assert "runaway (longest loop before → after)" in gates and "batch invariance (alone, batch, cache hit)" in gates
    assert "none new (4 prompts)" in gates and "1 new: prompt 2 in a batch from token 3 (7 alone, 9 batch)" in gates
    assert "none (3 → 4 repeats, 3 generations)" in gates and "1 new loop (4 → 40 repeats, 1 generations)" in gates
    events = page.split("<h2>Registry events")[1].split("<h2>")[0]
    for kind in ("add", "reload", "gate", "rollback"):
        assert f"<td>{kind}</td>" in events
    assert "at 1.200x, commit c0ffeec0ff" in events and "passed: greedy same" in events
    runs = page.split("<h2>Tune runs")[1].split("<h2>")[0]
    assert "<td>gate-failed</td>" in runs and "rolled back: KL 0.5 &gt; 0.01" in runs and "<td>winner</td>" in runs
    assert '<td class="num">3</td>' in runs  # candidates of the first run
    # interpreter figures say so: the profile summary, its figures and its rows
    assert "TTFT median: <b>150.0 s</b>" in page and "tokens/s: <b>0.13</b>" in page
    assert page.count(INTERPRETER_BADGE) >= 5
    rows = page.split("<h2>Latest profile rows")[1].split("<h2>")[0]
    assert "0.00042%" in rows and "0.000075%" in rows and ">0.0%<" not in rows


def test_a_gpu_profile_carries_no_interpreter_label(tmp_path):
    with History(tmp_path / "h.db") as h:
        h.record_profile({**PROFILE, "device": "NVIDIA H200 sm90"})
        page = render(collect(h))
    assert INTERPRETER_BADGE not in page and CELL_BADGE not in page


def test_default_output_is_the_reports_folder_not_the_working_directory(capsys, tmp_path, monkeypatch):
    work, data = tmp_path / "checkout", tmp_path / "data"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("KERNELLOOP_REPORTS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    code, out, _ = run_report(capsys, "--history", str(tmp_path / "absent.db"))
    assert code == 0 and out.strip() == str(data / "kernelloop" / "reports" / REPORT_NAME)
    assert (data / "kernelloop" / "reports" / REPORT_NAME).is_file() and list(work.iterdir()) == []
    monkeypatch.setenv("KERNELLOOP_REPORTS", str(tmp_path / "mine"))
    code, out, _ = run_report(capsys, "--history", str(tmp_path / "absent.db"))
    assert code == 0 and out.strip() == str(tmp_path / "mine" / REPORT_NAME)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_report_outputs_are_ignored_by_git():
    for path in ("kernelloop-report/kernelloop-report.html", "kernelloop-report.html", "x/kernelloop-report.html.tmp"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path


def _pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    import numpy as np
    from matplotlib.image import imread

    image = (imread(png)[..., :3] * 255).round().astype(int)
    return int((image == np.array(rgb)).all(axis=-1).sum())


@pytest.mark.skipif(not any(shutil.which(b) for b in BROWSERS), reason="no chromium/google-chrome on PATH")
def test_screenshot_in_a_headless_browser_shows_the_charts(capsys, tmp_path):
    hist, out = tmp_path / "h.db", tmp_path / "out"
    fill(hist)
    with History(hist) as h:
        h.record_profile(INTERPRETER_PROFILE)
    assert run_report(capsys, "--history", str(hist), "--out", str(out))[0] == 0
    browser = next(shutil.which(b) for b in BROWSERS if shutil.which(b))
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}",
                    "--hide-scrollbars", "--force-device-scale-factor=1", f"--screenshot={shot}",
                    "--window-size=1200,4000", (out / REPORT_NAME).as_uri()], check=True, timeout=120, capture_output=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _pixels(shot, BAR_BLUE) > 20_000  # the bars of the time-share and roofline charts
    assert _pixels(shot, ACCEPTED_GREEN) > 2_000  # the accepted bars of the verdicts chart
    assert _pixels(shot, (0xFF, 0xF3, 0xE0)) > 2_000  # the interpreter badges' background
    assert _pixels(shot, (0xFF, 0xFF, 0xFF)) < 0.97 * 1200 * 4000  # not a blank page

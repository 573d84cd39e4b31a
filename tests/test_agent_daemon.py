"""`agent daemon`: tunes, serves /metrics, stops cleanly on SIGTERM, resumes the interrupted run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kernelloop.history import History

from tests.hf_checkpoints import make_checkpoint

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("daemon") / "ckpt", "gqa")


def _daemon(tmp_path: Path, model_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kernelloop.agent.cli", "daemon", "--model", str(model_dir), "--registry", str(tmp_path / "reg"),
         "--history", str(tmp_path / "h.db"), "--metrics-port", "0", "--op", "rmsnorm", "--rounds", "1", "--candidates", "2",
         "--interval", "0.2", "--gate-runaway-tokens", "0", "--gate-invariance-tokens", "0", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(proc: subprocess.Popen, text: str, timeout_s: float) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"never saw {text!r}:\n{''.join(lines)}")


@pytest.mark.slow
def test_sigterm_stops_between_steps_and_the_next_start_resumes(tmp_path: Path, model_dir: Path) -> None:
    proc = _daemon(tmp_path, model_dir)
    try:
        lines = _wait_for(proc, "metrics on http://", 60)
        url = lines[-1].split("metrics on ")[1].strip()
        _wait_for(proc, "checking", 180)  # a tune run is under way
        metrics = httpx.get(url, timeout=10).text
        assert 'kernelloop_daemon_state{state="tuning"} 1' in metrics and "kernelloop_daemon_up 1" in metrics
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=180)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped between two steps" in out
    with History(tmp_path / "h.db") as history:
        assert [r["status"] for r in history.runs()] == ["running"]  # interrupted, resumable
    proc = _daemon(tmp_path, model_dir, "--max-runs", "1")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert "resuming tune run" in out and "run budget spent" in out
    with History(tmp_path / "h.db") as history:
        runs = history.runs()
        assert len(runs) == 1 and runs[0]["status"] in ("winner", "no-winner", "gate-failed")
        verdicts = [a for a in history.attempts() if a["verdict_id"] is not None]
        assert len({a["candidate_id"] for a in verdicts}) == len(verdicts)  # none judged twice

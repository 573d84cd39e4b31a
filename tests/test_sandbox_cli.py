"""`agent check` end to end, and the sandbox's choices that the adversarial suite does not pin down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelloop.agent.cli import main
from kernelloop.history import History
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import Provenance
from kernelloop.sandbox import CheckOptions, Sandbox

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "tests" / "sandbox_candidates"


def agent(*args: str, env_home: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(env_home), "KERNELLOOP_CACHE": str(env_home / "cache"),
           "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "kernelloop.agent.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)


def test_a_usage_error_is_one_line_and_exit_2_from_a_real_process(tmp_path: Path) -> None:
    result = agent("check", "no_such_op", "x.py", env_home=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "unknown op" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("args, words", [
    (["check", "rmsnorm", "/nonexistent/cand.py"], "no such file"),
    (["check", "rmsnorm", str(CANDIDATES / "control_rmsnorm_row.py"), "--shapes", "[1, 2]"], "--shapes"),
    (["check", "rmsnorm", str(CANDIDATES / "control_rmsnorm_row.py"), "--shapes", '[{"d": 3}]'], "keys"),
    (["check", "rmsnorm", str(CANDIDATES / "control_rmsnorm_row.py"), "--dtypes", "float8"], "unknown dtype"),
])
def test_usage_errors_are_one_line_and_exit_2(args: list[str], words: str, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """In-process (the process start is the test above): `agent.cli.main` returns or exits with 2."""
    try:
        code = main([*args, "--registry", str(tmp_path / "reg"), "--history", str(tmp_path / "h.db")])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert out == ""


def test_a_directory_gives_one_verdict_per_file_and_the_last_line_is_json(tmp_path: Path) -> None:
    folder = tmp_path / "cands"
    folder.mkdir()
    (folder / "a_good.py").write_text((CANDIDATES / "control_rmsnorm_row.py").read_text())
    (folder / "b_static.py").write_text("import os\ndef forward(x, weight, eps):\n    return x\n")
    result = agent("check", "rmsnorm", str(folder), "--no-timing", "--json", "--dtypes", "float32",
                   "--registry", str(tmp_path / "reg"), "--history", str(tmp_path / "h.db"), env_home=tmp_path)
    assert result.returncode == 0, result.stderr
    verdicts = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(v["file"]).name for v in verdicts] == ["a_good.py", "b_static.py"]
    assert verdicts[0]["correct"] and verdicts[0]["failure"] is None
    assert verdicts[1]["failure"] == "static" and verdicts[1]["reason"].startswith("line 1:")
    for v in verdicts:
        assert {"op", "device", "correct", "accepted", "speedup", "reason"} <= set(v)
    with History(tmp_path / "h.db") as history:  # every attempt is recorded, with its verdict
        attempts = history.attempts(op="rmsnorm")
    assert sorted(a["failure"] or "none" for a in attempts) == ["none", "static"]


@pytest.mark.slow
def test_fresh_interpreter_mode_gives_the_same_verdicts(tmp_path: Path) -> None:
    paths = [CANDIDATES / "control_rmsnorm_row.py", CANDIDATES / "unwritten_tail.py"]
    results = []
    for fork in (True, False):
        options = CheckOptions(registry=tmp_path / "reg", timing=False, seed=3, fork_server=fork, dtypes=("float32",))
        with Sandbox(options) as sandbox:
            # The trial that failed, not its values: unwritten elements hold poison drawn per allocation.
            results.append([(v.correct, v.failure, v.reason.split(":")[0]) for v in
                            (sandbox.judge_source("rmsnorm", p.read_text(), str(p)) for p in paths)])
    assert results[0] == results[1]
    assert results[0][0][0] and results[0][1][1] == "mismatch"


def test_the_baseline_is_the_registrys_current_choice(tmp_path: Path) -> None:
    spec = get_op("rmsnorm")
    registry = Registry(tmp_path / "reg")
    options = CheckOptions(registry=registry.path, seed=4, dtypes=("float32",), rounds=3)
    with Sandbox(options) as sandbox:
        before = sandbox.judge_source("rmsnorm", (CANDIDATES / "control_rmsnorm_multirow.py").read_text(), "m.py")
        assert before.baseline == "the op's baseline kernel" and before.correct
        shape = before.timing["shape"]
        entry = registry.add("rmsnorm", (CANDIDATES / "control_rmsnorm_row.py").read_text(),
                             device="cpu-interpreter", dtype="float32", bucket=spec.bucket(shape), speedup=1.1,
                             speedup_ci=(1.05, 1.2), provenance=Provenance("human")).entry
        after = sandbox.judge_source("rmsnorm", (CANDIDATES / "control_rmsnorm_multirow.py").read_text(), "m.py")
    assert after.baseline == f"registry {entry.id}" and after.correct
    assert after.speedup is not None and len(after.speedup_interval) == 2

"""The A/B timing compares like with like: both sides replayed by processes of the same age, measured by
what they ran. (The clock itself: tests/test_sandbox_process_model.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.sandbox import CheckOptions, Sandbox
from kernelloop.sandbox.judge.children import Child

REPO = Path(__file__).resolve().parents[1]
HONEST = (REPO / "tests" / "sandbox_candidates" / "control_rmsnorm_row.py").read_text()


def test_both_sides_are_timed_in_replayers_of_the_same_age(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replayer that replayed the whole battery runs the op's own kernel about 4% faster than a new one,
    enough for an A/A to pass as a gain: the candidate's timed replays run in a replayer started for timing,
    which before the first timed round has replayed exactly as often as the baseline's."""
    replays: list[tuple[int, str]] = []
    start_replay = Child.start_replay

    def spy(self: Child, record, inputs, order=None) -> None:  # noqa: ANN001
        replays.append((self.pid, sandbox.run.phase))
        start_replay(self, record, inputs, order)

    monkeypatch.setattr(Child, "start_replay", spy)
    options = CheckOptions(registry=tmp_path / "no-registry", seed=4, dtypes=("float32",), rounds=2,
                           batch_invariance=False, confirm=False)
    with Sandbox(options) as sandbox:
        v = sandbox.judge_source("rmsnorm", HONEST, "honest.py")
    assert v.correct and v.timing and v.timing["rounds"] == 2, v.reason
    timed = [(pid, phase) for pid, phase in replays if phase.startswith("timing round")]
    battery = {pid for pid, phase in replays if not phase.startswith("timing round")}
    timed_pids = {pid for pid, _ in timed}
    assert battery and len(timed_pids) == 2 and not timed_pids & battery, (battery, timed_pids)
    warm = {pid: sum(1 for p, phase in timed if p == pid and phase.startswith("timing round 0")) for pid in timed_pids}
    assert len(set(warm.values())) == 1 and min(warm.values()) >= 1, warm

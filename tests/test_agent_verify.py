"""`agent verify`: every registry entry of this device re-judged; regressions reported or rolled back."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kernelloop.agent.commands import verify
from kernelloop.history import History
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import Provenance

CANDIDATES = Path(__file__).parent / "sandbox_candidates"


def _registry(tmp_path: Path) -> tuple[Registry, str, str]:
    registry = Registry(tmp_path / "registry")
    common = dict(device="cpu-interpreter", dtype="float32", speedup=1.5, speedup_ci=(1.2, 1.8),
                  provenance=Provenance("search"))
    good = registry.add("rmsnorm", (CANDIDATES / "control_rmsnorm_multirow.py").read_text(),
                        bucket="hidden=64,tokens=17-128", **common).entry
    bad = registry.add("rmsnorm", (CANDIDATES / "unwritten_tail.py").read_text(),  # as if a Triton upgrade broke it
                       bucket="hidden=64,tokens=2-16", **common).entry
    return registry, good.id, bad.id


def _args(tmp_path: Path, rollback: bool) -> argparse.Namespace:
    return argparse.Namespace(device="cpu", rollback=rollback, engine=None, registry=str(tmp_path / "registry"),
                              history=str(tmp_path / "history.db"), timeout=120.0, json=True)


@pytest.mark.slow
def test_a_regression_is_reported_then_rolled_back(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    registry, good, bad = _registry(tmp_path)
    assert verify.run(_args(tmp_path, rollback=False)) == 1  # reported, left in place
    assert {e.id for e in registry.entries()} == {good, bad}
    assert verify.run(_args(tmp_path, rollback=True)) == 0
    assert [e.id for e in registry.entries()] == [good]
    with History(tmp_path / "history.db") as history:
        events = history.registry_events(op="rmsnorm")
    verifies = [e for e in events if e["kind"] == "verify"]
    assert len(verifies) == 4 and {e["entry_id"] for e in verifies if not e["ok"]} == {bad}
    assert [e["entry_id"] for e in events if e["kind"] == "rollback"] == [bad]
    assert "mismatch" in capsys.readouterr().out

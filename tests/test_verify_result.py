"""`VerifyResult` (agent/verify.py): the typed result of re-judging one registry entry, and what
`agent verify` prints from it."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from kernelloop.agent.commands import verify as verify_command
from kernelloop.agent.verify import VerifyResult
from kernelloop.kernels.registry.entry import Entry, Provenance
from kernelloop.sandbox import Verdict

ENTRY = Entry(op="rmsnorm", device="cpu-interpreter", dtype="float32", bucket="hidden=64,tokens=2-16", sha256="ab" * 32,
              speedup=1.5, speedup_ci=(1.2, 1.8), provenance=Provenance("search"), verified_at="2030-01-01T00:00:00+00:00")


def _verdict(accepted: bool) -> Verdict:
    return Verdict(op="rmsnorm", device="cpu-interpreter", file=ENTRY.id, sha256=ENTRY.sha256, correct=accepted,
                   accepted=accepted, speedup=1.4 if accepted else None,
                   speedup_interval=[1.1, 1.7] if accepted else None, reason="ok" if accepted else "mismatch at 3",
                   failure=None if accepted else "mismatch", stage="done" if accepted else "correctness")


def test_a_result_is_frozen_and_says_whether_it_regressed() -> None:
    ok = VerifyResult(entry=ENTRY, ok=True, verdict=_verdict(True), rolled_back=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ok.ok = False  # type: ignore[misc]
    assert not ok.regressed
    assert VerifyResult(entry=ENTRY, ok=False, verdict=_verdict(False), rolled_back=False).regressed
    assert not VerifyResult(entry=ENTRY, ok=False, verdict=_verdict(False), rolled_back=True).regressed


def test_to_json_is_what_agent_verify_prints() -> None:
    result = VerifyResult(entry=ENTRY, ok=False, verdict=_verdict(False), rolled_back=True)
    assert result.to_json() == {"entry": ENTRY.id, "ok": False, "rolled_back": True, "correct": False, "speedup": None,
                                "speedup_interval": None, "failure": "mismatch", "reason": "mismatch at 3"}
    json.dumps(result.to_json())


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path, results: list[VerifyResult], as_json: bool) -> int:  # noqa: ANN001
    monkeypatch.setattr("kernelloop.agent.verify.verify_registry", lambda *a, **k: results)
    (tmp_path / "registry").mkdir(exist_ok=True)  # never read: verify_registry is replaced
    args = argparse.Namespace(device="cpu", rollback=False, engine=None, registry=str(tmp_path / "registry"),
                              history=str(tmp_path / "history.db"), timeout=None, json=as_json)
    return verify_command.run(args)


def test_the_command_reads_the_results(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:  # noqa: ANN001
    good = VerifyResult(entry=ENTRY, ok=True, verdict=_verdict(True), rolled_back=False)
    bad = VerifyResult(entry=ENTRY, ok=False, verdict=_verdict(False), rolled_back=False)
    assert _run(monkeypatch, tmp_path, [good], as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == [good.to_json()]
    assert _run(monkeypatch, tmp_path, [good, bad], as_json=False) == 1
    out = capsys.readouterr().out
    assert "1.40x" in out and "REGRESSED" in out and "mismatch at 3" in out
    assert _run(monkeypatch, tmp_path, [], as_json=False) == 0
    assert "no registry entries for this device" in capsys.readouterr().out

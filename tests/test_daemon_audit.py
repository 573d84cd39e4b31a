"""The daemon runs the shadow audit while it sleeps between tune runs (tune stubbed), and alone with tune off."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from kernelloop.agent import daemon as daemon_module
from kernelloop.agent.auditor import PollResult
from kernelloop.agent.daemon import Daemon, DaemonMetrics


class StubAuditor:
    def __init__(self, fail_first: bool = False, rollback_at: int | None = None) -> None:
        self.polls, self.fail_first, self.rollback_at = [], fail_first, rollback_at

    def poll(self) -> PollResult:
        self.polls.append(len(self.polls))
        if self.fail_first and len(self.polls) == 1:
            raise RuntimeError("engine restarting")
        rolled = [{"commit": "c" * 40, "reason": "greedy agreement 0.1 < 0.9"}] if len(self.polls) == self.rollback_at else []
        return PollResult(scored=1, rolled_back=rolled)


@pytest.fixture
def tunes(monkeypatch):
    runs: list[int] = []

    def run_tune(settings, ctx, resume=None):  # noqa: ANN001
        runs.append(len(runs))
        return {"status": "no_gain", "op": "rmsnorm", "run_id": len(runs)}

    monkeypatch.setattr(daemon_module, "run_tune", run_tune)
    monkeypatch.setattr(daemon_module, "unfinished_run", lambda ctx, op: None)
    return runs


def make(auditor, **kw) -> Daemon:  # noqa: ANN001
    return Daemon(SimpleNamespace(progress=lambda m: None), SimpleNamespace(op=None), interval_s=kw.pop("interval_s", 0.3),
                  max_runs=kw.pop("max_runs", None), max_seconds=kw.pop("max_seconds", None), metrics=DaemonMetrics(),
                  auditor=auditor, audit_every_s=0.05, **kw)


def test_the_daemon_audits_between_tune_runs_and_survives_a_failed_poll(tunes) -> None:
    auditor = StubAuditor(fail_first=True, rollback_at=3)
    d = make(auditor, max_runs=2)
    assert d.run() == 2 and tunes == [0, 1]
    assert len(auditor.polls) >= 3  # the sleep between the two runs polled every 0.05 s; the first poll raised
    assert d.metrics.audits == len(auditor.polls) - 1 and d.metrics.audit_rollbacks == 1
    assert "kernelloop_daemon_audit_rollbacks_total 1" in d.metrics.render()


def test_without_an_auditor_the_daemon_only_sleeps(tunes) -> None:
    d = make(None, max_runs=2, interval_s=0.01)
    assert d.run() == 2 and d.metrics.audits == 0


def test_audit_only_polls_until_stopped_and_never_tunes(tunes) -> None:
    auditor = StubAuditor()
    d = make(auditor, tune=False)
    threading.Timer(0.4, d.request_stop).start()
    assert d.run() == 0 and tunes == [] and len(auditor.polls) >= 3


def test_audit_only_needs_an_engine(capsys) -> None:
    from kernelloop.agent import cli

    assert cli.main(["daemon", "--audit-only", "--metrics-port", "-1"]) == 2
    assert "--audit-only" in capsys.readouterr().err

"""choose_target: the hottest op against its roofline, unless its recent runs all came to nothing."""

from __future__ import annotations

import pytest

from kernelloop.agent.loop.target import choose_target

PROFILE = {"rows": [{"name": "rope", "kind": "op", "share": 0.5, "roofline_pct": 10.0},
                    {"name": "rmsnorm", "kind": "op", "share": 0.4, "roofline_pct": 10.0}]}


class FakeHistory:
    def __init__(self, statuses: dict[str, list[str]]):
        self.statuses = statuses

    def recent_runs(self, command: str, op: str, since: str) -> list[dict]:
        return [{"status": s} for s in self.statuses.get(op, [])]


def test_the_hottest_op_is_chosen():
    assert choose_target(PROFILE, FakeHistory({}))[0] == "rope"


@pytest.mark.parametrize("status", ["no-winner", "gate-failed", "no-candidate"])
def test_an_op_whose_recent_runs_all_came_to_nothing_yields_to_the_next(status):
    assert choose_target(PROFILE, FakeHistory({"rope": [status, status]}))[0] == "rmsnorm"


def test_one_recent_winner_keeps_the_op_first():
    assert choose_target(PROFILE, FakeHistory({"rope": ["no-candidate", "winner"]}))[0] == "rope"

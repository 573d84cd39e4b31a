"""The Proposer protocol (agent/proposers/base.py): both proposers satisfy it, an object that lacks a
member is refused by name, and the tune loop's propose node reads `last_error` and `rejected` off it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelloop.agent.commands.common_args import close_proposers
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.nodes import Nodes
from kernelloop.agent.loop.state import TuneSettings
from kernelloop.agent.proposers.base import Proposal, Proposer, check_proposers
from kernelloop.agent.proposers.llm import LLMProposer
from kernelloop.agent.proposers.search import SearchProposer
from kernelloop.history import History
from kernelloop.kernels.registry import Registry


class Complete:
    """Every member of the protocol: nothing to propose, and an error that says why."""

    def __init__(self, error: str | None = None) -> None:
        self.last_error = error
        self.rejected: list = []
        self.closed = 0
        self.calls = 0

    def propose(self, ctx, feedback, n):  # noqa: ANN001
        self.calls += 1
        return []

    def close(self) -> None:
        self.closed += 1


class NoClose:
    last_error = None
    rejected: list = []

    def propose(self, ctx, feedback, n):  # noqa: ANN001
        return []


class NoLastError:
    rejected: list = []

    def propose(self, ctx, feedback, n):  # noqa: ANN001
        return []

    def close(self) -> None:
        pass


class ProposeOnly:
    def propose(self, ctx, feedback, n):  # noqa: ANN001
        return []


def test_both_proposers_are_proposers() -> None:
    llm = LLMProposer("some-model", "http://127.0.0.1:9/v1", "key", client=object())  # no network until asked
    search = SearchProposer()
    assert isinstance(llm, Proposer) and isinstance(search, Proposer)
    assert search.last_error is None and search.rejected == [] and llm.last_error is None and llm.rejected == []
    assert check_proposers({"search": search, "llm": llm}) == {"search": search, "llm": llm}
    search.close()
    search.close()  # idempotent, does nothing
    llm.close()     # a client passed in is the caller's: left alone


def test_an_object_missing_a_member_is_refused_by_name() -> None:
    assert isinstance(Complete(), Proposer)
    assert not isinstance(NoClose(), Proposer) and not isinstance(NoLastError(), Proposer)
    with pytest.raises(TypeError, match=r"proposer 'fake' \(NoClose\) is not a Proposer: it lacks close$"):
        check_proposers({"ok": Complete(), "fake": NoClose()})
    with pytest.raises(TypeError, match="it lacks last_error$"):
        check_proposers({"fake": NoLastError()})
    with pytest.raises(TypeError, match="it lacks close, last_error, rejected$"):
        check_proposers({"fake": ProposeOnly()})


def test_close_proposers_closes_each_once() -> None:
    a, b = Complete(), Complete()
    close_proposers({"a": a, "b": b})
    assert (a.closed, b.closed) == (1, 1)


def _propose(tmp_path: Path, proposers: dict) -> dict:
    """The tune loop's propose node, once, for rmsnorm (nothing else of the loop runs)."""
    with History(tmp_path / "h.db") as history:
        ctx = LoopContext(history=history, registry=Registry(tmp_path / "registry"), proposers=proposers)
        state = {"run_id": 1, "op": "rmsnorm", "dtype": "float32", "shapes": [{"tokens": 3, "hidden": 64}],
                 "bucket": "hidden=64,tokens=2-16", "roofline": {}, "round": 0, "pending": [], "judged": []}
        return Nodes(ctx, TuneSettings(op="rmsnorm")).propose(state)


def test_the_propose_node_reports_last_error_and_refuses_a_non_proposer(tmp_path: Path) -> None:
    down = Complete("connection error (gave up after 3 attempts)")
    update = _propose(tmp_path, {"llm": down, "search": Complete()})
    assert down.calls == 1 and update["pending"] == [] and update["status"] == "no-winner"
    assert update["errors"] == {"llm": "connection error (gave up after 3 attempts)"}
    assert update["reason"] == "LLM proposer: connection error (gave up after 3 attempts)"
    with pytest.raises(TypeError, match="it lacks close"):
        _propose(tmp_path, {"fake": NoClose()})


def test_the_propose_node_records_a_proposers_rejected_answers(tmp_path: Path) -> None:
    from kernelloop.agent.proposers.feedback import proposal_verdict

    rejecting = Complete()
    answer = Proposal("no code here", "llm", "answer 1")
    rejecting.rejected = [(answer, proposal_verdict("no-code", "the answer has no code block"))]
    update = _propose(tmp_path, {"llm": rejecting})
    assert [j["label"] for j in update["judged"]] == ["answer 1"]
    assert update["judged"][0]["verdict"]["failure"] == "no-code"

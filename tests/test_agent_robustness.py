"""A candidate that breaks a check never stops the agent (the agent side).

Whatever a candidate's text makes the judge raise (a parse that recurses too deep or runs out of
memory, text that does not encode) becomes a recorded verdict: `agent check` prints it and exits 0,
and `agent tune` records it and goes on, also when a killed run is resumed. Candidate texts the
loop must store and checkpoint (lone surrogates from an LLM's JSON, NUL bytes) pass through too.
Failures of the machine (OSError, KernelloopError) still stop the command with one line.

Costs: about 10 s in all (no candidate reaches a sandboxed process; the engine is a fake handle).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.graph import run_tune, unfinished_run
from kernelloop.agent.loop.state import TuneSettings
from kernelloop.agent.proposers.base import Proposal
from kernelloop.agent.proposers.llm import classify_answer
from kernelloop.agent.proposers.prompts import bare_code
from kernelloop.common.errors import KernelloopError
from kernelloop.history import History
from kernelloop.kernels.registry import Registry
from kernelloop.sandbox import Sandbox
from kernelloop.sandbox.verdict import judge_or_refuse

REPO = Path(__file__).resolve().parent.parent
FORWARD = "\n\ndef forward(x, weight, eps):\n    return x\n"
DEEP_RECURSION = "x = 1" + "+1" * 10_000 + FORWARD      # the parser raises RecursionError
DEEP_MEMORY = "x = " + "-" * 10_000 + "1" + FORWARD      # the parser raises MemoryError
NESTED_UNPARSE = "x = 1" + "+1" * 2_500 + FORWARD       # parses; ast.unparse recurses too deep
SURROGATE = "import os  # cut emoji \ud83d" + FORWARD    # from an LLM's JSON: does not encode as UTF-8
NUL = "x = 1\x00" + FORWARD
ODD_SOURCES = {"deep-recursion": DEEP_RECURSION, "deep-memory": DEEP_MEMORY, "nested-unparse": NESTED_UNPARSE,
               "surrogate": SURROGATE, "nul": NUL}


class Raising:
    """A sandbox whose judge raises `exc` (what a not-yet-total check does on odd text)."""

    fingerprint = "cpu-interpreter"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def judge_source(self, op: str, source: str, filename: str):  # noqa: ANN201
        raise self.exc


@pytest.mark.parametrize("exc", [RecursionError("maximum recursion depth exceeded during ast construction"),
                                 MemoryError(), UnicodeEncodeError("utf-8", "\ud83d", 0, 1, "surrogates not allowed"),
                                 ValueError("source code string cannot contain null bytes")])
def test_a_judge_that_raises_on_the_text_gives_a_static_verdict(exc: BaseException) -> None:
    v = judge_or_refuse(Raising(exc), "rmsnorm", SURROGATE, "odd.py")
    assert (v.failure, v.stage, v.correct, v.accepted) == ("static", "static", False, False)
    assert v.reason.startswith(f"the judge could not check this module ({type(exc).__name__}")
    assert len(v.sha256) == 64 and json.loads(v.json_line())["failure"] == "static"


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KernelloopError("cannot confine")])
def test_a_failure_of_the_machine_still_stops(exc: BaseException) -> None:
    with pytest.raises(type(exc)):
        judge_or_refuse(Raising(exc), "rmsnorm", FORWARD, "ok.py")


def test_agent_check_gives_a_verdict_for_every_odd_text(tmp_path: Path) -> None:
    files = []
    for name, text in ODD_SOURCES.items():
        path = tmp_path / f"{name}.py"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))  # bytes that are not UTF-8
        files.append(path)
    proc = subprocess.run([sys.executable, "-m", "kernelloop.agent.cli", "check", "rmsnorm", *map(str, files),
                           "--json", "--no-timing", "--history", str(tmp_path / "h.db")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [Path(v["file"]).stem for v in verdicts] == list(ODD_SOURCES)
    assert all(v["failure"] is not None and not v["correct"] for v in verdicts), verdicts
    with History(tmp_path / "h.db") as hist:
        assert len(hist.attempts(op="rmsnorm")) == len(ODD_SOURCES)  # every one recorded


def test_the_llm_proposer_and_the_prompts_survive_odd_code() -> None:
    source, failure, reason = classify_answer("```python\n" + DEEP_MEMORY, "stop")  # a block never closed
    assert (source, failure) == (None, "truncated") and "MemoryError" in reason
    assert bare_code(DEEP_RECURSION) == DEEP_RECURSION and bare_code(NESTED_UNPARSE) == NESTED_UNPARSE


# -- the tune loop ---------------------------------------------------------------------------------

PROFILE = {"rows": [{"name": "rmsnorm", "kind": "op", "share": 0.5, "calls": 4, "total_s": 1.0,
                     "shapes": [{"dtype": "float32", "shape": {"tokens": 4, "hidden": 64}, "seconds": 1.0,
                                 "calls": 4, "bucket": "tokens<=16"}]}]}


class FakeEngine:
    """The engine handle protocol (agent/engine_handle.py) without an engine: only the profile is asked for."""

    def profile(self, workload, progress=lambda message: None):  # noqa: ANN001, ANN201
        return PROFILE

    def reload(self, revision=None):  # noqa: ANN001, ANN201
        return {}

    def measure(self, prompt_ids, config, warmup=True):  # noqa: ANN001, ANN201
        raise AssertionError("no candidate here can win, so the gate never measures")

    def generate(self, prompt_ids, max_tokens, seeds):  # noqa: ANN001, ANN201
        raise AssertionError("no candidate here can win, so the gate never generates")

    def invariance(self, prompt_ids, max_tokens, batch):  # noqa: ANN001, ANN201
        raise AssertionError("no candidate here can win, so the gate never probes")

    def close(self) -> None:
        pass


class Odd:
    """Proposes every odd text in round 1, then nothing."""

    def __init__(self) -> None:
        self.rounds = [[Proposal(text, "odd", name) for name, text in ODD_SOURCES.items()]]
        self.last_error: str | None = None
        self.rejected: list = []

    def propose(self, ctx, feedback, n):  # noqa: ANN001, ANN201
        return self.rounds.pop(0) if self.rounds else []

    def close(self) -> None:
        pass


class Killed(BaseException):
    """A hard stop in the middle of a check (what SIGKILL is to the process)."""


def _context(tmp_path: Path, history: History) -> LoopContext:
    return LoopContext(history=history, registry=Registry(tmp_path / "registry"), proposers={"odd": Odd()},
                       engine=FakeEngine(), gate=GateConfig(prompts=("hi",), max_tokens=1))


SETTINGS = TuneSettings(op="rmsnorm", rounds=1, candidates=len(ODD_SOURCES), profile_requests=1)


def test_tune_records_a_verdict_for_each_odd_candidate_and_resumes_past_a_kill(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    original = Sandbox.judge_source
    calls: list[str] = []

    def judge(self, op: str, source: str, filename: str):  # noqa: ANN001, ANN202
        calls.append(filename)
        if filename == "deep-recursion":
            raise RecursionError("maximum recursion depth exceeded")  # the judge itself gives up on the text
        if filename == "surrogate" and calls.count(filename) == 1:
            raise Killed()  # the first run dies here, before this candidate's verdict
        return original(self, op, source, filename)

    monkeypatch.setattr(Sandbox, "judge_source", judge)
    with History(tmp_path / "history.db") as history:
        ctx = _context(tmp_path, history)
        with pytest.raises(Killed):
            run_tune(SETTINGS, ctx)
        ctx.close()
        run_id = unfinished_run(ctx, "rmsnorm")
        assert run_id is not None
        ctx = _context(tmp_path, history)
        state = run_tune(SETTINGS, ctx, resume=run_id)
        ctx.close()
        assert state["status"] == "no-winner", state.get("reason")
        # the reason counts the refusals by code and quotes the last one (a CI log shows why)
        assert re.match(r"no candidate was accepted by the sandbox \(\d+ static.*; last: ", state["reason"]), state["reason"]
        attempts = history.attempts(op="rmsnorm", limit=50)
        assert sorted(a["label"] for a in attempts) == sorted(ODD_SOURCES)  # one record each, none twice
        assert all(a["failure"] for a in attempts)
        by_label = {a["label"]: a for a in attempts}
        assert by_label["deep-recursion"]["failure"] == "static"
        assert "RecursionError" in by_label["deep-recursion"]["reason"]
        # judged once each, except the candidate whose check was killed (judged again on resume)
        assert sorted(calls) == sorted([*ODD_SOURCES, "surrogate"])
        assert unfinished_run(ctx, "rmsnorm") is None  # nothing left to resume: it does not stop again


def test_a_run_killed_before_its_first_checkpoint_restarts_as_itself(tmp_path: Path) -> None:
    """A kill between the run's record and the graph's first checkpoint resumes that run: one run, not a
    failed one ('no checkpoint to resume') and a new one."""
    with History(tmp_path / "history.db") as history:
        run_id = history.start_run("tune", "rmsnorm")  # what the killed process had written
        ctx = _context(tmp_path, history)
        ctx.proposers = {"odd": Odd()}
        messages: list[str] = []
        ctx.progress = messages.append
        assert unfinished_run(ctx, "rmsnorm") == run_id
        state = run_tune(SETTINGS, ctx, resume=run_id)
        ctx.close()
        runs = history.runs(limit=10)
        assert [r["id"] for r in runs] == [run_id] and runs[0]["status"] == state["status"] != "running"
        assert any(f"restarting tune run {run_id}" in m for m in messages)

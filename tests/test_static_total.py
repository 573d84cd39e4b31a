"""A check never stops the judge: `static_check` answers every input with a
StaticResult (deep nesting that makes the parser or a visitor recurse, inputs that make it run out of
memory, null bytes, bytes, non-text), `Sandbox.judge_source` turns a failure of any check it makes
before the processes start into a `static` verdict, and `agent check` prints verdicts and exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelloop.kernels.candidate.static_check import static_check

from tests.sandbox_support import ARGS, FORWARD, HEADER

REPO = Path(__file__).resolve().parent.parent


def _nested(prefix: str, suffix: str, n: int, inner: str = "0") -> str:
    return prefix * n + inner + suffix * n


PATHOLOGICAL = {
    "open-parentheses": "(" * 200_000,
    "nested-lambdas": HEADER + "f = " + "lambda: " * 100 + "0\n" + FORWARD,
    "chain-of-a-million": "x = " + "1+" * 1_000_000 + "1\n",
    "chain-under-the-size-limit": "x = " + "1+" * 99_990 + "1\n",
    "chain-that-parses": HEADER + "x = " + "1+" * 600 + "1\n" + FORWARD,
    "unary-chain": "x = " + "-" * 199_990 + "1\n",
    "not-chain": "x = " + "not " * 49_000 + "a\n",
    "attribute-chain": "x = a" + ".b" * 99_000 + "\n",
    "call-chain": "x = f" + "()" * 99_000 + "\n",
    "subscript-chain": "x = a" + "[0]" * 66_000 + "\n",
    "nested-lists": HEADER + "x = " + _nested("[", "]", 150) + "\n" + FORWARD,
    "nested-blocks": "if 1:\n" + "".join(" " * i + "if 1:\n" for i in range(1, 120)) + " " * 120 + "pass\n",
    "nested-defs": HEADER + "".join(" " * i + f"def f{i}():\n" for i in range(98)) + " " * 98 + "return " + "-" * 9 + "1\n" + FORWARD,
    "nested-format-spec": HEADER + "s = '" + "{:" * 400 + "}" * 400 + "'.format(1)\n" + FORWARD,
    "long-digits": "x = " + "1" * 190_000 + "\n",
    "null-byte": HEADER + "x = 1\0\n" + FORWARD,
    "too-large": "#" * 300_000,
    "too-many-nodes": HEADER + ("x = " + "-" * 90 + "1\n") * 1200 + FORWARD,
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_static_check_answers_every_pathological_input(name: str) -> None:
    result = static_check(PATHOLOGICAL[name], ARGS)
    assert result.ok is False and result.reason and "\n" not in result.reason, result


@pytest.mark.parametrize("value", [None, 42, ["import os"], b"import os\n", bytearray(b"\xff\xfe")])
def test_static_check_answers_input_that_is_not_text(value: object) -> None:
    result = static_check(value, ARGS)
    assert result.ok is False and result.reason


def test_bytes_are_checked_as_the_text_they_are() -> None:
    assert static_check((HEADER + FORWARD).encode(), ARGS).ok


def test_an_internal_failure_of_the_check_is_a_refusal(monkeypatch) -> None:
    from kernelloop.kernels.candidate import static_check as module

    def broken(*args: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(module, "purity_problems", broken)
    result = static_check(HEADER + FORWARD, ARGS)
    assert not result.ok and "could not analyse this module (KeyError)" in result.reason


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    from kernelloop.sandbox import CheckOptions, Sandbox

    options = CheckOptions(device="cpu", registry=tmp_path_factory.mktemp("registry"), timing=False, unconfined=True)
    with Sandbox(options) as box:
        yield box


@pytest.mark.parametrize("name", ["open-parentheses", "chain-that-parses", "chain-under-the-size-limit", "null-byte"])
def test_judge_source_gives_a_static_verdict(sandbox, name: str) -> None:
    v = sandbox.judge_source("rmsnorm", PATHOLOGICAL[name], f"{name}.py")
    assert v.failure == "static" and not v.correct and v.reason and v.stage == "static", v.to_json()
    assert sandbox.server is None or sandbox.server._sock is None  # no process was started for it


def test_a_check_that_raises_in_the_judge_is_a_static_verdict(sandbox, monkeypatch) -> None:
    from kernelloop.sandbox.judge import orchestrator as runner

    def broken(*args: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(runner, "static_check", broken)
    v = sandbox.judge_source("rmsnorm", HEADER + FORWARD, "x.py")
    assert v.failure == "static" and "RecursionError" in v.reason, v.to_json()


def test_text_with_undecodable_bytes_is_judged(sandbox) -> None:
    v = sandbox.judge_source("rmsnorm", (HEADER + "# caf\udce9\n" + FORWARD), "latin1.py")
    assert v.failure == "static" and "byte 0xE9 is not UTF-8" in v.reason and len(v.sha256) == 64


def test_agent_check_prints_a_verdict_for_each_and_exits_0(tmp_path) -> None:
    deep = tmp_path / "deep.py"
    deep.write_text(PATHOLOGICAL["chain-that-parses"])
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# -*- coding: latin-1 -*-\n" + (HEADER + "# caf\xe9\n" + FORWARD).encode("latin-1"))
    parens = tmp_path / "parens.py"
    parens.write_text(PATHOLOGICAL["open-parentheses"])
    proc = subprocess.run(
        [sys.executable, "-m", "kernelloop.agent.cli", "check", "rmsnorm", str(deep), str(latin), str(parens), "--json",
         "--no-timing", "--no-history", "--unconfined", "--registry", str(tmp_path / "registry")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [Path(v["file"]).name for v in verdicts] == ["deep.py", "latin.py", "parens.py"]
    assert all(v["failure"] == "static" and not v["correct"] for v in verdicts), verdicts
    assert "nested more than" in verdicts[0]["reason"]
    assert verdicts[1]["reason"].startswith("line 1: coding cookie 'latin-1'"), verdicts[1]["reason"]
    assert "syntax error" in verdicts[2]["reason"]

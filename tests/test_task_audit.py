"""The task audit's parts (agent/task_suite.py, agent/task_audit.py, kernelloop/common/stats.py paired_ratio_interval):
the suite loader's one-line errors, the answer checks per kind, and the after/before verdict. Fast: no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelloop.agent.gate import judge
from kernelloop.agent.gate_config import GateConfig
from kernelloop.agent.task_audit import accuracy, check, compare, first_json, first_wrong, score
from kernelloop.agent.task_suite import SuiteError, TaskItem, load_suite
from kernelloop.common.stats import paired_ratio_interval
from kernelloop.kernels.device import CPU, CUDA

HEADER = {"suite": "t", "version": 1}
CALL = {"id": "c", "kind": "tool_call", "messages": [{"role": "user", "content": "Ship 907 to Lyon for Ann."}],
        "expect": {"name": "ship", "arguments": {"id": 907, "to.city": "Lyon", "who": "Ann"}}}


def _write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_the_bundled_suite_loads_with_its_kinds() -> None:
    suite = load_suite("agent-v1")
    assert (suite.name, suite.version) == ("agent-v1", 1)
    assert suite.counts() == {"json": 10, "tool_call": 12, "trace": 15}
    trace = [item for item in suite.items if item.kind == "trace"]
    assert [item.step for item in trace] == list(range(1, 16)) and len({item.trace for item in trace}) == 1
    assert all(len(b.messages) == len(a.messages) + 2 for a, b in zip(trace, trace[1:]))  # the conversation grows
    assert any("." in path for item in suite.items if item.kind == "tool_call" for path in item.expect["arguments"])
    assert load_suite(str(Path(__file__).parent / "tiny_tasks.jsonl")).counts() == {"json": 1, "tool_call": 1, "trace": 0}


@pytest.mark.parametrize("lines,where,needle", [
    ([HEADER, "{not json"], 2, "not JSON"),
    ([{"version": 1}, CALL], 1, "must name the suite"),
    ([HEADER, {**CALL, "kind": "essay"}], 2, "kind 'essay'"),
    ([HEADER, CALL, CALL], 3, "duplicate id 'c'"),
    ([HEADER, {**CALL, "messages": [{"role": "robot", "content": "x"}]}], 2, "message 0 must be"),
    ([HEADER, {**CALL, "expect": {"name": "ship"}}], 2, "at least one argument"),
    ([HEADER, {**CALL, "kind": "trace"}], 2, 'needs "trace"'),
    ([HEADER], 1, "no items"),
])
def test_a_bad_suite_is_one_line_naming_file_and_line(tmp_path: Path, lines: list, where: int, needle: str) -> None:
    path = _write(tmp_path, *lines)
    with pytest.raises(SuiteError) as info:
        load_suite(str(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}:{where}: ") and needle in message, message


def test_an_unknown_suite_names_the_bundled_ones() -> None:
    with pytest.raises(SuiteError, match="neither a bundled suite \\(agent-v1\\) nor a file"):
        load_suite("agent-v9")


def test_first_json_skips_prose_fences_and_broken_braces() -> None:
    assert first_json('Sure! {oops} ```json\n{"a": {"b": [1, 2]}}\n``` and {"c": 3}') == {"a": {"b": [1, 2]}}
    assert first_json("no object here [1, 2]") is None
    assert first_json('{"unclosed": 1') is None


def test_check_per_kind_passes_the_right_answer_and_names_the_first_wrong_field() -> None:
    call = TaskItem("c", "tool_call", tuple(CALL["messages"]), CALL["expect"])
    right = '<tool_call>{"name": "ship", "arguments": {"id": 907, "to": {"city": "Lyon"}, "who": "Ann"}}</tool_call>'
    assert check(call, right)
    assert first_wrong(call, right.replace("907", "970")) == "arguments.id is 970, expected 907"
    assert first_wrong(call, right.replace('{"city": "Lyon"}', '"Lyon"')) == 'arguments.to.city is missing, expected "Lyon"'
    assert first_wrong(call, right.replace('"ship"', '"send"')) == 'name is "send", expected "ship"'
    assert first_wrong(call, "I shipped it.") == "no JSON object in the answer"
    js = TaskItem("j", "json", ({"role": "user", "content": "x"},), {"keys": ["name", "age"], "values": {"age": 30}})
    assert check(js, '{"name": "Alice", "age": 30}')
    assert first_wrong(js, '{"name": "Alice"}') == "key 'age' missing"
    assert first_wrong(js, '{"name": "Alice", "age": "30"}') == 'age is "30", expected 30'
    assert not check(TaskItem("b", "json", js.messages, {"values": {"ok": True}}), '{"ok": 1}')  # true is not 1
    assert score([js, js], ['{"name": "A", "age": 30}', None]) == [True, None]
    assert accuracy([True, False, None, True]) == pytest.approx(2 / 3)


def _audit(passed: list[bool | None]) -> dict:
    return {"suite": "t v1", "ids": [f"i{i}" for i in range(len(passed))], "passed": passed,
            "wrong": [None if p else "x is 1, expected 2" for p in passed], "skipped": passed.count(None)}


def test_compare_fails_a_real_drop_and_passes_equal_or_nothing_to_lose() -> None:
    before = [True] * 14 + [False] * 23
    drop = compare(_audit(before), _audit([True] * 5 + [False] * 32), tolerance=0.05)
    assert drop.failed and drop.interval[1] < 0.95 and drop.ratio == pytest.approx(5 / 14)
    assert "accuracy 14/37 -> 5/37" in drop.describe() and "9 lost, first i5 (x is 1, expected 2)" in drop.describe()
    same = compare(_audit(before), _audit(before), tolerance=0.05)
    assert not same.failed and same.interval == [1.0, 1.0]
    one = compare(_audit(before), _audit([False] + before[1:]), tolerance=0.05)  # one flip: not confident
    assert not one.failed and one.interval[1] >= 1.0
    nothing = compare(_audit([False] * 37), _audit([False] * 37), tolerance=0.05)
    assert not nothing.failed and nothing.ratio == 1.0
    skipped = compare(_audit([None] + before[1:]), _audit([True] + before[1:]), tolerance=0.05)
    assert skipped.skipped == 1 and not skipped.failed


def test_paired_ratio_interval_is_seeded_and_needs_pairs() -> None:
    b, a = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert paired_ratio_interval(b, a, seed=3) == paired_ratio_interval(b, a, seed=3)
    with pytest.raises(ValueError, match="paired"):
        paired_ratio_interval(b, a[:-1])


SUMMARY = {"greedy": [[1, 2]], "kl": 1e-6}
FAST = {"before": [1.0], "after": [1.0], "ratios": [1.0], "ratio": 1.0, "interval": [1.0, 1.0]}
SLOW = {"before": [1.0], "after": [0.5], "ratios": [0.5], "ratio": 0.5, "interval": [0.5, 0.5]}


def test_the_gate_judges_tasks_after_runaway_and_before_speed() -> None:
    before = {**SUMMARY, "tasks": _audit([True] * 14 + [False] * 23)}
    after = {**SUMMARY, "tasks": _audit([True] * 5 + [False] * 32)}
    result = judge(before, after, SLOW, GateConfig())
    assert not result.ok and result.reason.startswith("tasks: t v1 accuracy 14/37 -> 5/37"), result.reason
    assert result.tasks["failed"]
    assert judge({**before, "greedy": [[9]]}, after, FAST, GateConfig()).reason.startswith("greedy output")
    clean = judge(before, {**SUMMARY, "tasks": before["tasks"]}, FAST, GateConfig())
    assert clean.ok and "tasks t v1 accuracy 14/37 -> 14/37" in clean.reason
    assert judge(before, after, FAST, GateConfig(task_tolerance=0.9)).ok  # a loose tolerance lets it through
    assert judge(SUMMARY, after, FAST, GateConfig()).tasks is None  # a checkpoint from before the audit


class CharTokenizer:
    """One token per character; no chat template (so agent/gate.py chat_ids writes "role: content" lines)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


class Answering:
    """An engine handle whose greedy answer to a prompt is scripted by the prompt's text."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers, self.calls = answers, []

    def generate(self, prompt_ids, max_tokens, seeds):  # noqa: ANN001, ANN201
        self.calls.append((len(prompt_ids), max_tokens, seeds))
        texts = ["".join(map(chr, p)) for p in prompt_ids]
        return [[ord(c) for c in next((a for k, a in self.answers.items() if k in t), "no idea")] for t in texts]

    profile = reload = measure = invariance = close = lambda *a, **k: None  # noqa: E731


def test_the_context_audits_through_the_engine_handle_and_skips_what_does_not_fit(monkeypatch) -> None:
    from types import SimpleNamespace

    from kernelloop.agent.loop.context import LoopContext

    tiny = str(Path(__file__).parent / "tiny_tasks.jsonl")
    engine = Answering({"Add 2 and 3": 'Calling: {"name": "add", "arguments": {"a": 2, "b": 3}}',
                        'key "n"': '{"n": 2}'})
    ctx = LoopContext(history=None, registry=None, proposers={}, engine=engine, gate=GateConfig(tasks=tiny))
    ctx._reference = SimpleNamespace(tokenizer=CharTokenizer(), engine=SimpleNamespace(max_model_len=4096))
    audit = ctx.task_audit()
    assert audit == {"suite": "tiny v1", "ids": ["json-01", "call-01"], "passed": [False, True],
                     "wrong": ["n is 2, expected 1", None], "skipped": 0}
    assert engine.calls == [(2, 4, [None, None])]  # greedy, the suite's max_tokens, one chunk
    short = LoopContext(history=None, registry=None, proposers={}, engine=engine, gate=GateConfig(tasks=tiny))
    short._reference = SimpleNamespace(tokenizer=CharTokenizer(), engine=SimpleNamespace(max_model_len=80))
    assert short.task_audit()["passed"] == [False, None] and short.task_audit()["skipped"] == 1  # call-01 is 150 chars
    assert LoopContext(history=None, registry=None, proposers={}, engine=engine).task_audit() is None  # off by default


def test_gate_tasks_defaults_by_device_and_refuses_a_bad_suite_up_front(tmp_path: Path) -> None:
    import argparse

    from kernelloop.agent.commands.common_args import add_tune_arguments, gate_config
    from kernelloop.common.errors import KernelloopError

    p = argparse.ArgumentParser()
    add_tune_arguments(p)
    assert gate_config(p.parse_args([]), CPU).tasks == "off"
    assert gate_config(p.parse_args([]), CUDA).tasks == "agent-v1"
    tiny = str(Path(__file__).parent / "tiny_tasks.jsonl")
    chosen = gate_config(p.parse_args(["--gate-tasks", tiny, "--gate-task-tolerance", "0.2"]), CPU)
    assert (chosen.tasks, chosen.task_tolerance) == (tiny, 0.2)
    with pytest.raises(SuiteError, match=":2: not JSON"):
        gate_config(p.parse_args(["--gate-tasks", str(_write(tmp_path, HEADER, "{oops"))]), CUDA)
    with pytest.raises(KernelloopError, match="--gate-task-tolerance"):
        gate_config(p.parse_args(["--gate-task-tolerance", "1.5"]), CPU)


def test_the_tasks_row_in_the_tune_output_and_the_report() -> None:
    from kernelloop.agent.commands.tune import task_row
    from kernelloop.history.report import _tasks

    drop = compare(_audit([None] + [True] * 13 + [False] * 23), _audit([None] + [True] * 4 + [False] * 32), 0.05)
    assert task_row(drop.to_json()).startswith("FAILED: t v1 accuracy 13/36 -> 4/36, after/before 0.31x [")
    assert ", 1 skipped" in task_row(drop.to_json())
    cell = _tasks(drop.to_json())
    assert cell.startswith("13/36 → 4/36 [") and cell.endswith(", 1 skipped") and _tasks(None) == "-"

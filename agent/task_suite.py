"""Task suites for the gate's task audit (agent/task_audit.py): versioned JSONL data, one item a line.

The first line is the header: {"suite": NAME, "version": N, "max_tokens": M (answer tokens per item,
default 64), "description": ...}. Every other line is an item:

    {"id": "call-03", "kind": "tool_call", "messages": [{"role": "system"|"user"|"assistant"|"tool",
     "content": "..."}, ...], "expect": {...}}

kinds and what `expect` holds:
    json       the answer holds a JSON object; "keys": names it must have, "values": {key: value} it must equal
    tool_call  the answer holds a call {"name": ..., "arguments": {...}}; "name": the tool, "arguments":
               {dotted.path: value} copied from the prompt (a number, a name, a nested field)
    trace      one step of a scripted agent trace ("trace": its name, "step": 1, 2, ...): the conversation so
               far as messages, and the next call as for tool_call

The messages are chat-templated the way the engine serves chat requests (the model's own template).
`load_suite` takes a bundled suite's name (agent/tasks/NAME.jsonl) or a path; a bad file is a
SuiteError naming file:line and what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelloop.common.errors import KernelloopError

BUNDLED = Path(__file__).parent / "tasks"
KINDS = ("json", "tool_call", "trace")
ROLES = ("system", "user", "assistant", "tool")
DEFAULT_MAX_TOKENS = 64


class SuiteError(KernelloopError):
    """A task suite that cannot be used: the message names file:line and what is wrong."""


@dataclass(frozen=True)
class TaskItem:
    id: str
    kind: str
    messages: tuple[dict[str, str], ...]
    expect: dict[str, Any] = field(default_factory=dict)
    trace: str | None = None
    step: int | None = None


@dataclass(frozen=True)
class TaskSuite:
    name: str
    version: int
    items: tuple[TaskItem, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    path: str = ""

    def counts(self) -> dict[str, int]:
        """Items per kind."""
        return {kind: sum(1 for item in self.items if item.kind == kind) for kind in KINDS}


def suite_path(name_or_path: str) -> Path:
    """A bundled suite's file for a bare name ("agent-v1"), else the path itself."""
    bundled = BUNDLED / f"{name_or_path}.jsonl"
    if "/" not in name_or_path and not name_or_path.endswith(".jsonl") and bundled.is_file():
        return bundled
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in BUNDLED.glob("*.jsonl")))
        raise SuiteError(f"task suite {name_or_path!r} is neither a bundled suite ({known}) nor a file")
    return path


def load_suite(name_or_path: str) -> TaskSuite:
    """The suite `name_or_path` names (a bundled name or a JSONL file), checked line by line."""
    path = suite_path(name_or_path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{path}: cannot read the task suite ({exc})") from None
    rows = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not rows:
        raise SuiteError(f"{path}:1: empty task suite (the first line must be its header)")
    parsed = []
    for n, line in rows:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteError(f"{path}:{n}: not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise SuiteError(f"{path}:{n}: each line must be a JSON object")
        parsed.append((n, obj))
    (n, header), items = parsed[0], parsed[1:]
    name, version, max_tokens = _header(header, f"{path}:{n}")
    out: list[TaskItem] = []
    for n, obj in items:
        out.append(_item(obj, f"{path}:{n}"))
        if out[-1].id in {item.id for item in out[:-1]}:
            raise SuiteError(f"{path}:{n}: duplicate id {out[-1].id!r}")
    if not out:
        raise SuiteError(f"{path}:{n}: the suite has a header but no items")
    return TaskSuite(name, version, tuple(out), max_tokens, str(path))


def _header(obj: dict[str, Any], where: str) -> tuple[str, int, int]:
    name, version, max_tokens = obj.get("suite"), obj.get("version"), obj.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(name, str) or not name:
        raise SuiteError(f'{where}: the header must name the suite ({{"suite": NAME, "version": N}})')
    if not _is_int(version) or version < 1:
        raise SuiteError(f"{where}: the header's version must be a positive integer")
    if not _is_int(max_tokens) or not 0 < max_tokens <= 1024:
        raise SuiteError(f"{where}: max_tokens must be an integer from 1 to 1024")
    return name, version, max_tokens


def _item(obj: dict[str, Any], where: str) -> TaskItem:
    item_id, kind, messages, expect = obj.get("id"), obj.get("kind"), obj.get("messages"), obj.get("expect", {})
    if not isinstance(item_id, str) or not item_id:
        raise SuiteError(f"{where}: the item needs an id (a non-empty string)")
    if kind not in KINDS:
        raise SuiteError(f"{where}: item {item_id!r} has kind {kind!r}; kinds: {', '.join(KINDS)}")
    if not isinstance(messages, list) or not messages:
        raise SuiteError(f"{where}: item {item_id!r} needs messages (a non-empty list)")
    for i, m in enumerate(messages):
        if (not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str)
                or not m["content"]):
            raise SuiteError(f"{where}: item {item_id!r} message {i} must be "
                             f'{{"role": {"|".join(ROLES)}, "content": non-empty text}}')
    if not isinstance(expect, dict):
        raise SuiteError(f"{where}: item {item_id!r}: expect must be an object")
    if kind == "json":
        keys, values = expect.get("keys", []), expect.get("values", {})
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or not isinstance(values, dict):
            raise SuiteError(f'{where}: item {item_id!r}: expect is {{"keys": [names], "values": {{key: value}}}}')
    else:
        name, arguments = expect.get("name"), expect.get("arguments")
        if not isinstance(name, str) or not name or not isinstance(arguments, dict) or not arguments:
            raise SuiteError(f'{where}: item {item_id!r}: expect is {{"name": TOOL, "arguments": {{path: value}}}} '
                             "with at least one argument")
    trace, step = obj.get("trace"), obj.get("step")
    if kind == "trace" and (not isinstance(trace, str) or not _is_int(step) or step < 1):
        raise SuiteError(f'{where}: trace item {item_id!r} needs "trace" (a name) and "step" (1, 2, ...)')
    return TaskItem(item_id, kind, tuple(messages), expect, trace if kind == "trace" else None,
                    step if kind == "trace" else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

"""The gate's task audit: does the model still do agent-shaped tasks after a kernel change?

A suite (agent/task_suite.py) is answered greedily before and after; each item passes or fails by
`check` (JSON validity, tool-call argument fidelity, the next call of a scripted trace). `compare`
pairs the items and bootstraps the after/before accuracy ratio (kernelloop/common/stats.py
`paired_ratio_interval`): the audit fails only when the whole 95% interval is below 1 - tolerance,
i.e. the model is confidently worse. A model that passed nothing before has nothing to lose.

What it guarantees: a kernel that degrades the model on these tasks (for example only on prompts
longer than the gate's short ones) by more than the tolerance, on most items, is caught. What it does
not: a change that flips an item or two (within the interval), or harm on tasks unlike the suite's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from kernelloop.agent.task_suite import TaskItem
from kernelloop.common.stats import paired_ratio_interval

_MISSING = object()


def first_json(text: str) -> dict[str, Any] | None:
    """The first balanced JSON object in `text` (prose, code fences or tags around it are skipped); None if none."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            return obj
        start = text.find("{", start + 1)
    return None


def _field(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, str) and isinstance(got, str):
        return got.strip() == want.strip()
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    return got == want


def first_wrong(item: TaskItem, text: str) -> str | None:
    """What is wrong with `text` as the answer to `item` (the first wrong field), or None when it passes."""
    obj = first_json(text)
    if obj is None:
        return "no JSON object in the answer"
    if item.kind == "json":
        for key in item.expect.get("keys", []):
            if key not in obj:
                return f"key {key!r} missing"
        values = item.expect.get("values", {})
        for key, want in values.items():
            got = _field(obj, key)
            if got is _MISSING or not _same(got, want):
                return f"{key} is {'missing' if got is _MISSING else json.dumps(got)}, expected {json.dumps(want)}"
        return None
    if obj.get("name") != item.expect["name"]:
        return f"name is {json.dumps(obj.get('name'))}, expected {json.dumps(item.expect['name'])}"
    arguments = obj.get("arguments")
    if isinstance(arguments, str):  # some models send the arguments JSON-encoded, as OpenAI's API does
        arguments = first_json(arguments)
    if not isinstance(arguments, dict):
        return "arguments is not an object"
    for path, want in item.expect["arguments"].items():
        got = _field(arguments, path)
        if got is _MISSING or not _same(got, want):
            return (f"arguments.{path} is {'missing' if got is _MISSING else json.dumps(got)}, "
                    f"expected {json.dumps(want)}")
    return None


def check(item: TaskItem, text: str) -> bool:
    """Whether `text` answers `item` correctly."""
    return first_wrong(item, text) is None


def score(items: list[TaskItem] | tuple[TaskItem, ...], texts: list[str | None]) -> list[bool | None]:
    """Each item's pass (None where its answer is None: skipped)."""
    return [None if text is None else check(item, text) for item, text in zip(items, texts)]


def accuracy(passed: list[bool | None]) -> float:
    """The share of the scored (not skipped) items that passed; 0.0 when none was scored."""
    scored = [p for p in passed if p is not None]
    return sum(scored) / len(scored) if scored else 0.0


@dataclass
class TaskComparison:
    """The audit's verdict: items paired before/after (skipped on either side left out)."""

    suite: str
    ids: list[str]
    before: list[bool | None]
    after: list[bool | None]
    accuracy_before: float
    accuracy_after: float
    ratio: float
    interval: list[float]
    tolerance: float
    skipped: int
    failed: bool
    wrong: list[str | None] | None = None  # after: each item's first wrong field

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def counts(self) -> tuple[int, int, int]:
        """(passed before, passed after, items scored on both sides)."""
        pairs = [(b, a) for b, a in zip(self.before, self.after) if b is not None and a is not None]
        return sum(b for b, _ in pairs), sum(a for _, a in pairs), len(pairs)

    def lost(self) -> list[int]:
        """Indexes of the items that passed before and fail after."""
        return [i for i, (b, a) in enumerate(zip(self.before, self.after)) if b and a is False]

    def describe(self) -> str:
        b, a, n = self.counts()
        lost = self.lost()
        first = ""
        if lost:
            why = self.wrong[lost[0]] if self.wrong else None
            first = f"; {len(lost)} lost, first {self.ids[lost[0]]}" + (f" ({why})" if why else "")
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return (f"{self.suite} accuracy {b}/{n} -> {a}/{n}, after/before {self.ratio:.2f}x "
                f"[{self.interval[0]:.2f}, {self.interval[1]:.2f}]{skipped}{first}")


def compare(before: dict[str, Any], after: dict[str, Any], tolerance: float, seed: int = 0) -> TaskComparison:
    """Two audits (LoopContext.task_audit: {"suite", "ids", "passed", "wrong", "skipped"}) of the same suite,
    judged: failed when the 95% interval of after/before accuracy lies wholly below 1 - tolerance."""
    if before["ids"] != after["ids"]:
        raise ValueError(f"the task audits before ({before['suite']}) and after ({after['suite']}) ran other items")
    pairs = [(b, a) for b, a in zip(before["passed"], after["passed"]) if b is not None and a is not None]
    skipped = len(before["ids"]) - len(pairs)
    ratio, lo, hi = paired_ratio_interval([float(b) for b, _ in pairs], [float(a) for _, a in pairs], seed)
    return TaskComparison(after["suite"], list(after["ids"]), list(before["passed"]), list(after["passed"]),
                          accuracy([b for b, _ in pairs]), accuracy([a for _, a in pairs]), ratio, [lo, hi],
                          tolerance, skipped, hi < 1 - tolerance, after.get("wrong"))

"""Progress messages: plain strings, some of which also say how far a task is (`Step`).

Every long phase reports through one callback type, `Progress`: a function of one string. A phase
that knows where it is out of how many (a battery's trial N/M, a timing round N/M against the
candidate's deadline, profile requests done, gate rounds) passes a `Step`, which is a `str` (its
text is the line a log shows) carrying `task`, `done` and `total` too. So any consumer of plain
strings keeps working, and a terminal's display (agent/progress_view.py) can draw one bar per task.

This module lives in `kernelloop.common`, which every layer may import, so that the sandbox, the profiler
and the agent all emit the same Steps.
"""

from __future__ import annotations

import time
from typing import Any, Callable

Progress = Callable[[str], None]


class Step(str):
    """A progress message that is also a position in a task: `done` of `total` units, counted the way
    its text counts them ("trial 3/40" is done=3, total=40). `deadline`, when set, is the
    `time.monotonic()` by which the task must end (a sandbox budget, a profile window); `detail` is a
    short note a bar may show beside it; `log` asks a live display to keep the text as a line too
    (a gate round's figures), where other Steps only move their bar."""

    task: str
    done: int
    total: int
    deadline: float | None
    detail: str
    log: bool

    def __new__(cls, text: str, task: str, done: int, total: int, deadline: float | None = None,
                detail: str = "", log: bool = False) -> "Step":
        step = super().__new__(cls, text)
        step.task, step.done, step.total = task, int(done), max(int(total), 0)
        step.deadline, step.detail, step.log = deadline, detail, log
        return step

    def __reduce__(self) -> tuple[Any, ...]:
        return Step, (str(self), self.task, self.done, self.total, self.deadline, self.detail, self.log)

    def __repr__(self) -> str:
        return f"Step({str(self)!r}, task={self.task!r}, {self.done}/{self.total})"

    def seconds_left(self, now: float | None = None) -> float | None:
        """Seconds until `deadline` (never negative); None without one."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - (time.monotonic() if now is None else now))

    def with_text(self, text: str) -> "Step":
        """The same position with another text."""
        return Step(text, self.task, self.done, self.total, self.deadline, self.detail, self.log)


def prefixed(prefix: str, message: str) -> str:
    """`prefix + message`, still a Step when `message` is one."""
    if not prefix:
        return message
    if isinstance(message, Step):
        return message.with_text(prefix + str(message))
    return prefix + message


def takes_every_step(progress: Progress) -> bool:
    """Whether `progress` shows every Step without printing it (a live display of bars, or a wrapper
    of one that says so with a true `takes_every_step` attribute): a throttle then passes it all
    Steps, and drops only what it would print."""
    return bool(getattr(progress, "takes_every_step", False))

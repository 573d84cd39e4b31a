"""Where a command's progress goes: rich progress bars on a terminal, plain lines otherwise.

`ProgressView` is the `Progress` callback (kernelloop/common/progress.py) that `agent tune`, `check`, `profile`
and `daemon` hand down. Used as a context manager, it starts a live display on stderr when stderr
is a terminal (and TERM is not "dumb"): each `Step` then moves the bar of its task (one bar per
task: battery trials, timing rounds against the candidate's deadline, profile requests, gate
rounds), and every plain message is printed above the bars as a line, after the bars of the step
before are cleared (a plain message marks a new step of the run, so no bar is left stale). A Step
with `log` set is kept as a line as well. Anywhere else (a pipe, CI, tests) every message, Steps
included, is one plain line through `emit`, exactly the text the emitter wrote, with control
characters (a candidate's escape sequences quoted in a reason) made visible (kernels/display.py).

The bars go to stderr; stdout is redirected through the display only when it is the terminal too,
so `--json` output into a pipe or file is never touched. NO_COLOR is honoured by rich itself.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, Task, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bars
from rich.table import Column
from rich.text import Text

from kernelloop.common.progress import Step
from kernelloop.kernels.display import safe_text

REFRESH_PER_SECOND = 4  # the elapsed and time-left columns tick; a 2-core box has better uses for its CPU


def to_stderr(message: str) -> None:
    """One line on stderr (the stream as it is now: the live display's proxy while bars are shown)."""
    print(message, file=sys.stderr, flush=True)


def terminal() -> bool:
    """Whether progress should be drawn as bars: stderr is a terminal that can move its cursor."""
    try:
        return sys.stderr.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


class _TimeLeft(ProgressColumn):
    """Seconds left before the task's deadline (a sandbox budget, a profile window), while it runs."""

    def render(self, task: Task) -> Text:
        deadline = task.fields.get("deadline")
        if deadline is None or task.finished:  # a finished task's deadline no longer matters
            return Text("")
        return Text(f"{max(0.0, deadline - time.monotonic()):.0f} s left", style="progress.remaining")


class _Detail(ProgressColumn):
    """The Step's note, on one line: the column that gives way (cut with an ellipsis) on a narrow terminal."""

    def render(self, task: Task) -> Text:
        return Text(task.fields.get("detail") or "", no_wrap=True, overflow="ellipsis")


def make_bars(console: Console) -> Bars:
    """The display: task, bar, N/M, time elapsed, time left, detail."""
    return Bars(TextColumn("{task.description}", markup=False, table_column=Column(no_wrap=True)),
                BarColumn(bar_width=24), MofNCompleteColumn(table_column=Column(no_wrap=True)),
                TimeElapsedColumn(table_column=Column(no_wrap=True)), _TimeLeft(table_column=Column(no_wrap=True)),
                _Detail(),
                console=console, transient=True, refresh_per_second=REFRESH_PER_SECOND,
                redirect_stdout=_stdout_is_terminal(), redirect_stderr=True)


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressView:
    """A `Progress` callback: bars while entered on a terminal (`live`), plain lines through `emit`
    otherwise. `live=None` decides from stderr; `console` is where bars are drawn (default: stderr)."""

    def __init__(self, emit: Callable[[str], None] = to_stderr, *, live: bool | None = None,
                 console: Console | None = None) -> None:
        self.emit = emit
        self.live = terminal() if live is None else live
        self._console = console
        self._bars: Bars | None = None
        self._tasks: dict[str, tuple[TaskID, int]] = {}  # task -> (its bar, done)
        self._lock = threading.Lock()

    def shown(self) -> dict[str, int]:
        """The bars shown now: task -> done (empty without a live display)."""
        with self._lock:
            return {task: done for task, (_, done) in self._tasks.items()}

    @property
    def takes_every_step(self) -> bool:
        """True while bars are shown: throttles (agent/render.py) then pass every Step."""
        return self._bars is not None

    def __enter__(self) -> "ProgressView":
        if self.live:
            self._bars = make_bars(self._console or Console(stderr=True, highlight=False))
            self._bars.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop the bars (they vanish); later messages are plain lines."""
        with self._lock:
            bars, self._bars = self._bars, None
            self._tasks.clear()
        if bars is not None:
            bars.stop()

    def __call__(self, message: str) -> None:
        bars = self._bars
        if bars is None:
            self.emit(safe_text(message, multiline=True))  # a Step stays one unless it had to be escaped
            return
        if isinstance(message, Step):
            self._move(bars, message)
            if message.log:
                self.emit(safe_text(str(message), multiline=True))
            return
        self._clear(bars)
        self.emit(safe_text(message, multiline=True))

    def _move(self, bars: Bars, step: Step) -> None:
        fields = {"deadline": step.deadline, "detail": safe_text(step.detail)}
        with self._lock:
            task, done = self._tasks.get(step.task, (None, 0))
            if task is None:
                task = bars.add_task(step.task, total=step.total, completed=step.done, **fields)
            elif step.done < done:  # the task began again (the next candidate)
                bars.reset(task, total=step.total, completed=step.done, **fields)
            else:
                bars.update(task, total=step.total, completed=step.done, **fields)
            self._tasks[step.task] = (task, step.done)
        bars.refresh()

    def _clear(self, bars: Bars) -> None:
        with self._lock:
            if not self._tasks:
                return
            for task, _ in self._tasks.values():
                bars.remove_task(task)
            self._tasks.clear()
        bars.refresh()  # before the message is printed: the display above which it goes has no stale bar


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A logging handler that writes to `sys.stderr` as it is at each record, so that log lines go
    above a live display's bars (which replace sys.stderr by a proxy while shown) instead of through them."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass

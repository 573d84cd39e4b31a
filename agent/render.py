"""Output for people (rich tables on stdout) and for programs (one JSON document).

Every cell, title and warning is display-safe (kernels/display.py: a candidate's escape sequences are
shown, never acted on); JSON escapes every control and non-ASCII code point by itself."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelloop.common.progress import Progress, Step, prefixed, takes_every_step
from kernelloop.kernels.display import safe_text

console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=escape(safe_text(title)), title_justify="left")
    for col in columns:
        table.add_column(escape(safe_text(col)), overflow="fold")
    for row in rows:
        table.add_row(*(escape(safe_text(v)) for v in row))
    console.print(table)


class SafeFormatter(logging.Formatter):
    """A log line (the daemon's, quoting verdict reasons) with control characters made visible;
    tracebacks keep their newlines."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record), multiline=True)


def warn(message: str) -> None:
    """One line on stderr, for what a person should know but that does not stop the command."""
    sys.stderr.write(f"warning: {safe_text(message)}\n")


def throttled(emit: Progress, every_s: float = 5.0, prefix: str = "") -> Progress:
    """A progress callback that passes on at most one message per `every_s` seconds (the first at once):
    long phases (a sandbox battery, timing rounds) show where they are without a line per step. When
    `emit` takes every step (a terminal's bars, kernelloop/common/progress.py), the Steps it would drop still
    reach it; they move a bar and print nothing."""
    last = [float("-inf")]

    def progress(message: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            emit(prefixed(prefix, message))
        elif isinstance(message, Step) and takes_every_step(emit):
            emit(prefixed(prefix, message))

    return progress

"""Output for people (rich tables on stdout) and for programs (one JSON document)."""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=escape(title), title_justify="left")
    for col in columns:
        table.add_column(escape(col), overflow="fold")
    for row in rows:
        table.add_row(*(escape(str(v)) for v in row))
    console.print(table)

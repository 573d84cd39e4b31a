"""Opening the history file safely: path defaults, the SQLite header check, connection settings.

Nothing here writes to a file before it is known to be an SQLite database (or a new, empty one).
"""

from __future__ import annotations

import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from kernelloop.common.errors import KernelloopError
from kernelloop.common.paths import data_path

SQLITE_HEADER = b"SQLite format 3\x00"
# PRAGMA application_id of a kernelloop history: "KLHI" as a big-endian 32-bit integer.
APPLICATION_ID = int.from_bytes(b"KLHI", "big")
BUSY_TIMEOUT_S = 30.0


class HistoryError(KernelloopError):
    """The history database cannot be opened, read or written; the message is one line."""


def default_history_path() -> Path:
    """$KERNELLOOP_HISTORY, else $XDG_DATA_HOME/kernelloop/history.db (~/.local/share/...)."""
    return data_path("KERNELLOOP_HISTORY", "history.db")


def default_report_dir() -> Path:
    """$KERNELLOOP_REPORTS, else $XDG_DATA_HOME/kernelloop/reports: never the working directory,
    so a report does not land in a checkout."""
    return data_path("KERNELLOOP_REPORTS", "reports")


def resolve_path(path: str | os.PathLike[str] | None) -> Path:
    return default_history_path() if path is None else Path(path).expanduser()


def now_iso() -> str:
    """The current time as ISO-8601 UTC text with microseconds (sorts as text)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def check_file(path: Path) -> bool:
    """True when `path` exists and holds a database; False when it is absent or empty (a new one).

    Raises HistoryError for anything that is not an SQLite file, without modifying it.
    """
    if not path.exists():
        return False
    if path.is_dir():
        raise HistoryError(f"{path} is a directory, not a history database")
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise HistoryError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not header:
        return False
    if header != SQLITE_HEADER:
        raise HistoryError(f"{path} is not an SQLite database; refusing to use it as the kernelloop history")
    return True


def connect(path: Path) -> sqlite_utils.Database:
    """A connection in driver autocommit mode (transactions are explicit), with a busy timeout
    and foreign keys on. Does not write: WAL mode is set later, once the file is known to be ours."""
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        return sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot open history {path}: {exc}") from None


def inspect(db: sqlite_utils.Database, path: Path) -> int:
    """The schema version of an existing file; HistoryError if it is some other application's database."""
    try:
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = [n for n in db.table_names() if not n.startswith("sqlite_")]
    except sqlite3.DatabaseError as exc:
        raise HistoryError(f"{path} is not a usable SQLite database ({exc}); "
                           "refusing to use it as the kernelloop history") from None
    if app_id not in (0, APPLICATION_ID) or (version == 0 and tables):
        shown = ", ".join(sorted(tables)[:5]) or "none"
        raise HistoryError(f"{path} is an SQLite database of another application (tables: {shown}); "
                           "refusing to use it as the kernelloop history")
    return version


def enable_wal(db: sqlite_utils.Database, path: Path) -> None:
    try:
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode = wal")
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot switch {path} to WAL mode: {exc}") from None

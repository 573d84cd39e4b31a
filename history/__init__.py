"""The history: one SQLite file recording profiles, candidates, verdicts, registry events and runs.

`History(path)` opens (and creates or migrates) it; `default_history_path()` is
$KERNELLOOP_HISTORY, else $XDG_DATA_HOME/kernelloop/history.db; `default_report_dir()` (where
`agent report` writes) is $KERNELLOOP_REPORTS, else $XDG_DATA_HOME/kernelloop/reports.
"""

from history.db import HistoryError, default_history_path, default_report_dir
from history.schema import SCHEMA_VERSION
from history.store import History

__all__ = ["History", "HistoryError", "SCHEMA_VERSION", "default_history_path", "default_report_dir"]

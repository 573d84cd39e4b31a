"""The history: one SQLite file recording profiles, candidates, verdicts, registry events and runs.

`History(path)` opens (and creates or migrates) it; `default_history_path()` is
$KERNELLOOP_HISTORY, else $XDG_DATA_HOME/kernelloop/history.db; `default_report_dir()` (where
`agent report` writes) is $KERNELLOOP_REPORTS, else $XDG_DATA_HOME/kernelloop/reports.
"""

from kernelloop.history.db import HistoryError, default_history_path, default_report_dir
from kernelloop.history.schema import SCHEMA_VERSION
from kernelloop.history.store import History

__all__ = ["History", "HistoryError", "SCHEMA_VERSION", "default_history_path", "default_report_dir"]

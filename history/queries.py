"""Reading the history: the queries `History` offers (its base class, over the connection it is given).

Every query returns plain dicts (JSON-ready: booleans as bool, JSON columns parsed), newest first
unless said otherwise.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import sqlite_utils

from kernelloop.history.db import HistoryError

BOOL_COLUMNS = ("correct", "accepted", "partial", "ok", "loop", "json_asked", "json_valid")
JSON_COLUMNS = {"shapes_json": "shapes", "detail_json": "detail", "judged_by": "judged_by"}


def fts_query(text: str) -> str:
    """User text as an FTS5 query: every word a quoted phrase (all must match), so punctuation
    and FTS operators in the text are taken literally."""
    words = text.split()
    if not words:
        raise HistoryError("empty search text")
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    for col in BOOL_COLUMNS:
        if col in row and row[col] is not None:
            row[col] = bool(row[col])
    for col, key in JSON_COLUMNS.items():
        if col in row:
            raw = row.pop(col)
            row[key] = None if raw is None else json.loads(raw)
    return row


ATTEMPTS_SQL = """
SELECT * FROM (
SELECT c.id AS candidate_id, c.created_at, c.op, c.proposer,
       -- candidates recorded before v3 (or without a label) show the file name the sandbox was given
       coalesce(c.label, json_extract(v.json, '$.file')) AS label, c.model, c.sha256, c.run_id, c.parent_id,
       c.prompt_hash, c.tokens_prompt, c.tokens_completion,
       v.id AS verdict_id, v.created_at AS verdict_at, v.device, v.correct, v.accepted, v.failure,
       v.reason, v.stage, v.speedup, v.speedup_lo, v.speedup_hi, v.baseline, v.duration_s
FROM candidates c
LEFT JOIN verdicts v ON v.id = (SELECT max(id) FROM verdicts WHERE candidate_id = c.id)
WHERE (:op IS NULL OR c.op = :op)
) a
WHERE :search IS NULL
   OR a.candidate_id IN (SELECT rowid FROM candidates_fts WHERE candidates_fts MATCH :search)
   OR a.candidate_id IN (SELECT candidate_id FROM verdicts
                         WHERE id IN (SELECT rowid FROM verdicts_fts WHERE verdicts_fts MATCH :search)
                            OR instr(replace(lower(failure), '-', ' '), :needle) > 0)
   OR instr(replace(lower(coalesce(a.label, '') || ' ' || kl_outcome(a.verdict_id, a.accepted, a.correct,
                                                                     a.failure, a.stage)), '-', ' '), :needle) > 0
ORDER BY a.candidate_id DESC
LIMIT :limit
"""


def _needle(text: str) -> str:
    """Search text as matched against failure codes, labels and outcome words: lower case,
    '-' as a space, single spaces (so "timing incomplete" finds "timing-incomplete")."""
    return " ".join(text.lower().replace("-", " ").split())


def attempt_time(attempt: dict[str, Any]) -> str:
    """When an attempt row was settled: its verdict's time, else (still pending) its proposal's."""
    return attempt.get("verdict_at") or attempt.get("created_at") or ""


PROPOSAL_STAGE = "proposal"  # the verdict stage of an LLM answer that never reached the sandbox


def outcome(attempt: dict[str, Any]) -> str:
    """A word or two for an attempt row: pending, accepted, correct, correct, timing incomplete (cut
    off while being timed), not judged (an unusable or repeated answer, stage "proposal") or wrong."""
    if attempt.get("verdict_id") is None:
        return "pending"
    if attempt.get("accepted"):
        return "accepted"
    if attempt.get("correct"):
        return "correct, timing incomplete" if attempt.get("failure") == "timing-incomplete" else "correct"
    return "not judged" if attempt.get("stage") == PROPOSAL_STAGE else "wrong"


def _sql_outcome(verdict_id: Any, accepted: Any, correct: Any, failure: Any, stage: Any) -> str:
    """outcome() as an SQL function, so --search matches the words the table shows."""
    return outcome({"verdict_id": verdict_id, "accepted": accepted, "correct": correct, "failure": failure,
                    "stage": stage})


class Queries:
    """Reading one history database: every query, over the connection, path and lock it is given (`History`,
    its subclass, writes through the same three)."""

    def __init__(self, db: sqlite_utils.Database, path: Path, lock: threading.RLock) -> None:
        self.db, self.path, self._lock = db, path, lock

    def _rows(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        with self._lock:
            try:
                cur = self.db.execute(sql, params)
            except sqlite3.Error as exc:
                raise HistoryError(f"cannot read history {self.path}: {exc}") from None
            cols = [d[0] for d in cur.description]
            return [_clean(dict(zip(cols, r))) for r in cur.fetchall()]

    def attempts(self, op: str | None = None, limit: int = 50, search: str | None = None) -> list[dict[str, Any]]:
        """Candidates, newest first, each with its latest verdict's fields (None when not judged yet)
        and its `label`. `search` matches full-text over the candidate's source and its verdicts'
        reasons, or as a substring of a verdict's failure code, the label or the outcome() words."""
        params = {"op": op, "limit": int(limit), "search": None if search is None else fts_query(search),
                  "needle": None if search is None else _needle(search)}
        with self._lock:
            self.db.conn.create_function("kl_outcome", 5, _sql_outcome, deterministic=True)
            return self._rows(ATTEMPTS_SQL, params)

    def candidate(self, candidate_id: int) -> dict[str, Any] | None:
        """One candidate with its source and prompt, and all its verdicts (oldest first, parsed JSON)."""
        rows = self._rows("SELECT * FROM candidates WHERE id = ?", [candidate_id])
        if not rows:
            return None
        verdicts = self._rows("SELECT id, created_at, json FROM verdicts WHERE candidate_id = ? ORDER BY id", [candidate_id])
        rows[0]["verdicts"] = [{"id": v["id"], "created_at": v["created_at"], **json.loads(v["json"])} for v in verdicts]
        return rows[0]

    def find_candidate(self, run_id: int, sha256: str) -> int | None:
        """The id of the candidate with this source hash already recorded for agent run `run_id`."""
        rows = self._rows("SELECT id FROM candidates WHERE run_id = ? AND sha256 = ? ORDER BY id LIMIT 1",
                          [run_id, sha256])
        return rows[0]["id"] if rows else None

    def recent_runs(self, command: str, op: str, since: str) -> list[dict[str, Any]]:
        """Runs of `command` for `op` started at or after `since` (ISO 8601 UTC), newest first."""
        return self._rows("SELECT * FROM agent_runs WHERE command = ? AND op = ? AND started_at >= ? ORDER BY id DESC",
                          [command, op, since])

    def profiles(self, limit: int = 20) -> list[dict[str, Any]]:
        """Profile summaries (without raw_json or rows), newest first."""
        return self._rows("SELECT * FROM profiles ORDER BY id DESC LIMIT ?", [int(limit)])

    def profile_rows(self, profile_id: int) -> list[dict[str, Any]]:
        """A profile's op/other rows in recorded order, with `shapes` parsed."""
        return self._rows("SELECT * FROM profile_ops WHERE profile_id = ? ORDER BY id", [profile_id])

    def latest_profile(self) -> dict[str, Any] | None:
        """The newest profile's summary with its `rows`, or None when none was recorded."""
        found = self._rows("SELECT * FROM profiles ORDER BY id DESC LIMIT 1")
        if not found:
            return None
        profile = found[0]
        profile.pop("raw_json", None)
        profile["rows"] = self.profile_rows(profile["id"])
        return profile

    def accepted_over_time(self, op: str | None = None) -> list[dict[str, Any]]:
        """Accepted verdicts, oldest first: when, which op/device/kernel, and the speedup with its interval."""
        return self._rows(
            "SELECT v.id AS verdict_id, v.candidate_id, v.created_at, v.op, v.device, v.speedup, v.speedup_lo,"
            " v.speedup_hi, v.baseline, c.sha256, c.proposer FROM verdicts v LEFT JOIN candidates c"
            " ON c.id = v.candidate_id WHERE v.accepted = 1 AND (:op IS NULL OR v.op = :op) ORDER BY v.id",
            {"op": op})

    def rejection_counts(self) -> dict[str, dict[str, int]]:
        """{op: {failure code: number of rejected verdicts}} over all verdicts."""
        out: dict[str, dict[str, int]] = {}
        for r in self._rows("SELECT op, coalesce(failure, CASE WHEN correct THEN 'correct, not timed' ELSE 'unknown' END) AS failure, count(*) AS n FROM verdicts"
                            " WHERE coalesce(accepted, 0) = 0 GROUP BY op, failure ORDER BY op, n DESC"):
            out.setdefault(r["op"] or "?", {})[r["failure"]] = r["n"]
        return out

    def registry_events(self, op: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Registry events, newest first, with `detail` parsed."""
        return self._rows("SELECT * FROM registry_events WHERE (:op IS NULL OR op = :op) ORDER BY id DESC LIMIT :limit",
                          {"op": op, "limit": int(limit)})

    def runs(self, limit: int = 50, command: str | None = None) -> list[dict[str, Any]]:
        """Agent runs (of `command` only, when given), newest first, with `detail` parsed."""
        return self._rows("SELECT * FROM agent_runs WHERE (:command IS NULL OR command = :command)"
                          " ORDER BY id DESC LIMIT :limit", {"command": command, "limit": int(limit)})

    def run_judges(self, run_id: int) -> list[dict[str, Any]]:
        """Which cluster actors judged agent run `run_id`'s candidates: one row per actor (its `judged_by`
        less `retried`, as JSON), with `verdicts` and `retried` counts; [] when all were judged locally."""
        rows = self._rows(
            "SELECT json_remove(v.judged_by, '$.retried') AS judged_by, count(*) AS verdicts,"
            " sum(coalesce(json_extract(v.judged_by, '$.retried'), 0)) AS retried"
            " FROM verdicts v JOIN candidates c ON c.id = v.candidate_id"
            " WHERE c.run_id = ? AND v.judged_by IS NOT NULL GROUP BY 1 ORDER BY 1", [run_id])
        return sorted(rows, key=lambda r: (r["judged_by"].get("actor", 0), r["judged_by"].get("node", "")))

    def audit_samples(self, commit: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Shadow-audit scores (of registry `commit` only, when given), the newest `limit` (all when None),
        oldest first."""
        rows = self._rows("SELECT * FROM audit_samples WHERE (:commit IS NULL OR commit_sha = :commit)"
                          " ORDER BY id DESC LIMIT :limit", {"commit": commit, "limit": -1 if limit is None else int(limit)})
        return rows[::-1]

    def audit_cursor(self, instance: str) -> int:
        """The next seq to read from the engine audit queue `instance` (0 when none was audited)."""
        rows = self._rows("SELECT max(seq) AS seq FROM audit_samples WHERE instance = ?", [instance])
        return 0 if not rows or rows[0]["seq"] is None else int(rows[0]["seq"]) + 1

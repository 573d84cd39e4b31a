"""`History`: the SQLite record of everything the loop tried (profiles, candidates, verdicts,
registry events, agent runs).

Several processes may write one file at once: WAL journal, a 30 s busy timeout, and every write in
its own short `BEGIN IMMEDIATE` transaction that is committed before the `record_*` call returns.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import sqlite_utils

from kernelloop.common.profile_contract import PROFILE_COLUMNS, PROFILE_ROW_COLUMNS, Profile
from kernelloop.history import queries
from kernelloop.history.db import HistoryError, check_file, connect, enable_wal, inspect, now_iso, resolve_path
from kernelloop.history.schema import SCHEMA_VERSION, migrate
from kernelloop.kernels.registry.entry import sha256_text

REGISTRY_EVENT_KINDS = ("add", "reload", "rollback", "gate", "verify", "pr", "quantize")
EVENT_FIELDS = ("entry_id", "commit_sha", "device", "dtype", "bucket", "speedup")


def _json(data: Any) -> str:
    return json.dumps(data, default=str, separators=(",", ":"))


def _scalar(value: Any) -> Any:
    """Dicts and lists become JSON text; scalars stay."""
    return _json(value) if isinstance(value, (dict, list, tuple)) else value


def _bool(value: Any) -> int | None:
    return None if value is None else int(bool(value))


class History(queries.Queries):
    """One history file. `History(path)` opens (creating parent folders and the file when absent)
    and migrates it; `path=None` means `default_history_path()`. Use as a context manager or `close()`.

    Raises HistoryError when the file is not an SQLite database (left byte-for-byte untouched), is
    another application's database, or has a schema newer than this code.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        resolved = resolve_path(path)
        if not check_file(resolved):
            try:
                resolved.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HistoryError(f"cannot create {resolved.parent}: {exc.strerror or exc}") from None
        super().__init__(connect(resolved), resolved, threading.RLock())
        try:
            self._open()
        except BaseException:
            self.db.close()
            raise

    def _open(self) -> None:
        version = inspect(self.db, self.path)
        if version > SCHEMA_VERSION:
            raise HistoryError(f"history {self.path} has schema version {version}, newer than this kernelloop "
                               f"(supports up to {SCHEMA_VERSION}); upgrade kernelloop to use it")
        enable_wal(self.db, self.path)
        if version < SCHEMA_VERSION:
            with self._write() as db:  # re-read under the write lock: another process may have migrated
                version = inspect(db, self.path)
                if version > SCHEMA_VERSION:
                    raise HistoryError(f"history {self.path} has schema version {version}, newer than this kernelloop")
                migrate(db, version)
        self.schema_version = SCHEMA_VERSION

    # -- plumbing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self.db.close()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite_utils.Database]:
        """One short write transaction, committed on exit (rolled back on an exception)."""
        with self._lock:
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise HistoryError(f"cannot write history {self.path}: {exc}") from None
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException as exc:
                if self.db.conn.in_transaction:
                    self.db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.IntegrityError):
                    raise HistoryError(f"history {self.path}: {exc}") from None
                if isinstance(exc, sqlite3.Error):
                    raise HistoryError(f"cannot write history {self.path}: {exc}") from None
                raise

    def _insert(self, db: sqlite_utils.Database, table: str, row: Mapping[str, Any]) -> int:
        return int(db[table].insert(dict(row)).last_pk)

    # -- writes -----------------------------------------------------------------------------------

    def record_profile(self, profile: Profile | Mapping[str, Any]) -> int:
        """Store one profile (kernelloop/common/profile_contract.py `Profile`): its column keys (`PROFILE_COLUMNS`,
        each row's `PROFILE_ROW_COLUMNS` and shapes) in the tables, missing keys as NULL, the whole dict
        in raw_json. Returns the profile id."""
        row: dict[str, Any] = {k: _scalar(profile.get(k)) for k in PROFILE_COLUMNS}
        row.update(created_at=profile.get("created_at") or now_iso(), partial=_bool(profile.get("partial")),
                   raw_json=_json(profile))
        with self._write() as db:
            profile_id = self._insert(db, "profiles", row)
            for op_row in profile.get("rows") or []:
                values = {k: _scalar(op_row.get(k)) for k in PROFILE_ROW_COLUMNS}
                shapes = op_row.get("shapes")
                values.update(profile_id=profile_id, shapes_json=None if shapes is None else _json(shapes))
                self._insert(db, "profile_ops", values)
        return profile_id

    def record_candidate(self, op: str, source: str, proposer: str, *, model: str | None = None,
                         prompt: str | None = None, tokens_prompt: int | None = None,
                         tokens_completion: int | None = None, run_id: int | None = None,
                         parent_id: int | None = None, label: str | None = None) -> int:
        """Store one proposed kernel source; its sha256 (and the prompt's) are computed here. `label` is
        the proposer's name for it (template config, file name), shown by `agent history`. Returns its id."""
        row = {
            "created_at": now_iso(), "run_id": run_id, "op": op, "source": source, "proposer": proposer, "label": label,
            "sha256": sha256_text(source), "model": model, "prompt": prompt,
            "prompt_hash": None if prompt is None else sha256_text(prompt),
            "tokens_prompt": tokens_prompt, "tokens_completion": tokens_completion, "parent_id": parent_id,
        }
        with self._write() as db:
            return self._insert(db, "candidates", row)

    def record_verdict(self, candidate_id: int, verdict: Mapping[str, Any]) -> int:
        """Store the sandbox's verdict (`Verdict.to_json()`) on a candidate, all of it in `json` (a cluster
        verdict's `judged_by` in its own column too); per-round timings when `verdict["timing"]["rounds_detail"]`
        lists them. Returns its id."""
        interval = verdict.get("speedup_interval") or [None, None]
        row = {
            "created_at": now_iso(), "candidate_id": candidate_id, "op": verdict.get("op"),
            "device": verdict.get("device"), "correct": _bool(verdict.get("correct")),
            "accepted": _bool(verdict.get("accepted")), "failure": verdict.get("failure"),
            "reason": verdict.get("reason"), "stage": verdict.get("stage"), "speedup": verdict.get("speedup"),
            "speedup_lo": interval[0], "speedup_hi": interval[1], "baseline": verdict.get("baseline"),
            "duration_s": verdict.get("duration_s"), "json": _json(verdict),
            "judged_by": None if verdict.get("judged_by") is None else _json(verdict["judged_by"]),
        }
        timing = verdict.get("timing") or {}
        rounds = timing.get("rounds_detail") if isinstance(timing, Mapping) else None
        with self._write() as db:
            found = db.execute("SELECT op FROM candidates WHERE id = ?", [candidate_id]).fetchone()
            if found is None:
                raise HistoryError(f"history {self.path}: no candidate {candidate_id}")
            row["op"] = row["op"] or found[0]
            verdict_id = self._insert(db, "verdicts", row)
            for i, r in enumerate(rounds if isinstance(rounds, list) else []):
                self._insert(db, "timings", {"verdict_id": verdict_id, "round": i,
                                             "baseline_s": r.get("baseline_s"), "candidate_s": r.get("candidate_s")})
        return verdict_id

    def record_attempt(self, op: str, source: str, proposer: str, verdict: Mapping[str, Any],
                       **candidate: Any) -> tuple[int, int]:
        """A candidate and its verdict together; returns (candidate_id, verdict_id)."""
        candidate_id = self.record_candidate(op, source, proposer, **candidate)
        return candidate_id, self.record_verdict(candidate_id, verdict)

    def record_registry_event(self, kind: str, op: str | None, **fields: Any) -> int:
        """Store a registry event; `kind` is one of REGISTRY_EVENT_KINDS. Known fields:
        entry_id, commit_sha, device, dtype, bucket, speedup, ok, detail (a dict); any other
        keyword goes into detail_json too. Returns its id."""
        if kind not in REGISTRY_EVENT_KINDS:
            raise ValueError(f"registry event kind {kind!r} is not one of {', '.join(REGISTRY_EVENT_KINDS)}")
        detail = dict(fields.pop("detail", None) or {})
        row: dict[str, Any] = {k: _scalar(fields.pop(k, None)) for k in EVENT_FIELDS}
        ok = fields.pop("ok", None)
        detail.update(fields)
        row.update(created_at=now_iso(), kind=kind, op=op, ok=_bool(ok), detail_json=_json(detail) if detail else None)
        with self._write() as db:
            return self._insert(db, "registry_events", row)

    def record_audit_sample(self, commit: str | None, score: Mapping[str, Any], *, engine: str = "",
                            instance: str = "", seq: int | None = None, request_id: str | None = None,
                            tokens: int | None = None, finished_at: float | None = None) -> int:
        """Store one shadow-audit score (agent/shadow_audit.py Score.to_json()) of a request served by
        registry `commit`; `instance`/`seq` locate it in the engine's audit queue. Returns its id."""
        row = {"created_at": now_iso(), "commit_sha": commit or "", "engine": engine, "instance": instance, "seq": seq,
               "request_id": request_id, "tokens": tokens, "agreement": score.get("agreement"), "kl": score.get("kl"),
               "loop": _bool(score.get("loop")), "json_asked": _bool(score.get("json_asked")),
               "json_valid": _bool(score.get("json_valid")), "finished_at": finished_at}
        with self._write() as db:
            return self._insert(db, "audit_samples", row)

    def start_run(self, command: str, op: str | None = None) -> int:
        """Mark the start of an agent command (status 'running'); returns the run id for finish_run."""
        with self._write() as db:
            return self._insert(db, "agent_runs", {"started_at": now_iso(), "command": command, "op": op,
                                                   "status": "running"})

    def finish_run(self, run_id: int, status: str, detail: Mapping[str, Any] | None = None) -> None:
        """Mark a run finished with `status` (e.g. ok, failed, interrupted) and optional details."""
        with self._write() as db:
            cur = db.execute("UPDATE agent_runs SET finished_at = ?, status = ?, detail_json = ? WHERE id = ?",
                             [now_iso(), status, None if detail is None else _json(detail), run_id])
            if cur.rowcount != 1:
                raise HistoryError(f"history {self.path}: no agent run {run_id}")

"""The history schema and its migrations.

The schema version is `PRAGMA user_version`. `MIGRATIONS[i]` takes a database at version `i` to
version `i + 1`; each runs inside the caller's write transaction, so a failed migration leaves the
file as it was. Migrations are append-only: once released, a function never changes; a new schema
change is a new function at the end. Older files are migrated in place, never dropped.
"""

from __future__ import annotations

from typing import Callable

import sqlite_utils

from kernelloop.history.db import APPLICATION_ID


def _v1_tables(db: sqlite_utils.Database) -> None:
    """v1: every table and index."""
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db["profiles"].create({
        "id": int, "created_at": str, "device": str, "engine": str, "model": str, "kernels": str,
        "partial": int, "partial_reason": str, "wall_seconds": float, "busy_seconds": float,
        "steps": int, "requests": int, "output_tokens": int, "tokens_per_second": float,
        "ttft_ms_median": float, "tpot_ms_median": float, "prefix_hit_rate": float, "raw_json": str,
    }, pk="id")
    db["profile_ops"].create({
        "id": int, "profile_id": int, "name": str, "kind": str, "calls": int, "total_s": float,
        "mean_us": float, "share": float, "variant": str, "bytes_per_s": float, "roofline_pct": float,
        "shapes_json": str,
    }, pk="id", foreign_keys=[("profile_id", "profiles", "id")])
    db["candidates"].create({
        "id": int, "created_at": str, "run_id": int, "op": str, "sha256": str, "source": str,
        "proposer": str, "model": str, "prompt": str, "prompt_hash": str, "tokens_prompt": int,
        "tokens_completion": int, "parent_id": int,
    }, pk="id", foreign_keys=[("parent_id", "candidates", "id")])
    db["verdicts"].create({
        "id": int, "created_at": str, "candidate_id": int, "op": str, "device": str, "correct": int,
        "accepted": int, "failure": str, "reason": str, "stage": str, "speedup": float,
        "speedup_lo": float, "speedup_hi": float, "baseline": str, "duration_s": float, "json": str,
    }, pk="id", foreign_keys=[("candidate_id", "candidates", "id")])
    db["timings"].create({
        "id": int, "verdict_id": int, "round": int, "baseline_s": float, "candidate_s": float,
    }, pk="id", foreign_keys=[("verdict_id", "verdicts", "id")])
    db["registry_events"].create({
        "id": int, "created_at": str, "kind": str, "op": str, "entry_id": str, "commit_sha": str,
        "device": str, "dtype": str, "bucket": str, "speedup": float, "ok": int, "detail_json": str,
    }, pk="id")
    db["agent_runs"].create({
        "id": int, "started_at": str, "finished_at": str, "command": str, "op": str, "status": str,
        "detail_json": str,
    }, pk="id")
    db["profile_ops"].create_index(["profile_id"])
    db["candidates"].create_index(["op"])
    db["candidates"].create_index(["sha256"])
    db["verdicts"].create_index(["candidate_id"])
    db["verdicts"].create_index(["op", "accepted"])
    db["timings"].create_index(["verdict_id"])
    db["registry_events"].create_index(["op"])


def _v2_full_text_search(db: sqlite_utils.Database) -> None:
    """v2: FTS5 over candidates.source and verdicts.reason, kept current by triggers; rows that
    already exist are indexed too."""
    db["candidates"].enable_fts(["source"], fts_version="FTS5", create_triggers=True)
    db["verdicts"].enable_fts(["reason"], fts_version="FTS5", create_triggers=True)


def _v3_candidate_label(db: sqlite_utils.Database) -> None:
    """v3: candidates.label, the proposer's name for a candidate (a template's config, a file's name);
    NULL on rows recorded before it."""
    db["candidates"].add_column("label", str)


def _v4_audit_samples(db: sqlite_utils.Database) -> None:
    """v4: audit_samples, one row per served request the shadow audit re-scored (agent/auditor.py): the
    registry commit that served it, the engine queue it came from (instance, seq: the auditor's cursor)."""
    db["audit_samples"].create({
        "id": int, "created_at": str, "commit_sha": str, "engine": str, "instance": str, "seq": int,
        "request_id": str, "tokens": int, "agreement": float, "kl": float, "loop": int, "json_asked": int,
        "json_valid": int, "finished_at": float,
    }, pk="id")
    db["audit_samples"].create_index(["commit_sha"])
    db["audit_samples"].create_index(["instance", "seq"])


def _v5_verdict_judged_by(db: sqlite_utils.Database) -> None:
    """v5: verdicts.judged_by, the cluster actor that judged it (JSON: actor, node, node_id, pid, device,
    retried; sandbox/cluster); NULL for a local verdict and on rows recorded before it."""
    db["verdicts"].add_column("judged_by", str)


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1_tables, _v2_full_text_search,
                                                            _v3_candidate_label, _v4_audit_samples,
                                                            _v5_verdict_judged_by]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite_utils.Database, current: int) -> int:
    """Apply the migrations after version `current` (call inside a write transaction); returns the new version."""
    for version in range(current, SCHEMA_VERSION):
        MIGRATIONS[version](db)
        db.execute(f"PRAGMA user_version = {version + 1}")
    return SCHEMA_VERSION

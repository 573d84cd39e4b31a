"""history/: the SQLite record — round trips, refusal of foreign files, migrations, concurrent writers,
and `agent history`."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlite_utils

from kernelloop.history import SCHEMA_VERSION, History, HistoryError, default_history_path
from kernelloop.history.schema import MIGRATIONS

ROOT = Path(__file__).resolve().parent.parent


def verdict(op: str = "rmsnorm", *, accepted: bool = False, failure: str | None = "mismatch",
            reason: str = "max error 0.5 at [3, 7]", speedup: float | None = None, **extra) -> dict:
    """A verdict dict shaped like sandbox.Verdict.to_json()."""
    return {"op": op, "device": "cpu-interpreter", "file": "cand.py", "sha256": "0" * 64,
            "correct": accepted or failure in ("not-faster", "impossible-speedup"), "accepted": accepted,
            "speedup": speedup, "speedup_interval": None if speedup is None else [speedup * 0.95, speedup * 1.05],
            "reason": reason, "failure": None if accepted else failure, "stage": "timing" if speedup else "correctness",
            "baseline": "baseline", "timing": {}, "checks": [{"name": "t0", "ok": True, "detail": ""}],
            "isolation": {"namespace": "user+net"}, "log_tail": "", "duration_s": 1.5, **extra}


PROFILE = {
    "device": "cpu-interpreter", "engine": "kernelloop", "model": "embedded-tiny", "kernels": "registry",
    "partial": True, "partial_reason": "stopped after 8 steps", "wall_seconds": 2.0, "busy_seconds": 1.5,
    "steps": 8, "requests": 2, "output_tokens": 16, "tokens_per_second": 8.0, "ttft_ms_median": 120.0,
    "tpot_ms_median": 60.0, "prefix_hit_rate": 0.25,
    "rows": [
        {"name": "rmsnorm", "kind": "op", "calls": 48, "total_s": 0.3, "mean_us": 6250.0, "share": 0.2,
         "variant": "baseline", "bytes_per_s": 1e9, "roofline_pct": 12.5,
         "shapes": [{"dtype": "float32", "bucket": "hidden=64,tokens=2-16", "shape": {"tokens": 7, "hidden": 64}, "calls": 48}]},
        {"name": "other", "kind": "other", "calls": 8, "total_s": 1.2, "share": 0.8},  # missing keys -> NULL
    ],
}


@pytest.fixture
def hist(tmp_path):
    with History(tmp_path / "h.db") as h:
        yield h


def test_default_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELLOOP_HISTORY", str(tmp_path / "x.db"))
    assert default_history_path() == tmp_path / "x.db"
    monkeypatch.delenv("KERNELLOOP_HISTORY")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_history_path() == tmp_path / "data" / "kernelloop" / "history.db"


def test_new_file_gets_parents_wal_and_current_schema(tmp_path):
    path = tmp_path / "deep" / "er" / "h.db"
    with History(path) as h:
        assert h.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert h.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        assert h.db.execute("PRAGMA busy_timeout").fetchone()[0] >= 30000
        assert {"profiles", "profile_ops", "candidates", "verdicts", "timings", "registry_events", "agent_runs",
                "candidates_fts", "verdicts_fts", "audit_samples"} <= set(h.db.table_names())
    assert path.read_bytes()[:16] == b"SQLite format 3\x00"


def test_profile_round_trip(hist):
    pid = hist.record_profile(PROFILE)
    latest = hist.latest_profile()
    assert latest["id"] == pid and latest["partial"] is True and latest["tokens_per_second"] == 8.0
    assert latest["created_at"].endswith("+00:00")
    rms, other = latest["rows"]
    assert rms["name"] == "rmsnorm" and rms["roofline_pct"] == 12.5 and rms["shapes"][0]["shape"] == {"tokens": 7, "hidden": 64}
    assert other["kind"] == "other" and other["mean_us"] is None and other["shapes"] is None
    raw = hist.db.execute("SELECT raw_json FROM profiles WHERE id = ?", [pid]).fetchone()[0]
    assert json.loads(raw) == PROFILE
    hist.record_profile({"device": "x", "created_at": "2030-01-01T00:00:00+00:00"})  # all else NULL, no rows
    assert [p["device"] for p in hist.profiles()] == ["x", "cpu-interpreter"]
    assert hist.latest_profile()["rows"] == [] and hist.latest_profile()["created_at"].startswith("2030")


def test_candidates_verdicts_timings_and_queries(hist):
    src = "import triton\n\ndef forward(x, weight, eps):\n    return _launch_fancy_kernel(x)\n"
    c1 = hist.record_candidate("rmsnorm", src, "llm", model="gpt-x", prompt="write rmsnorm", tokens_prompt=10)
    hist.record_verdict(c1, verdict(failure="mismatch", reason="max error 0.5 at [3, 7]"))
    detail = [{"baseline_s": 1.0, "candidate_s": 0.5}, {"baseline_s": 1.1, "candidate_s": 0.6}]
    v2 = hist.record_verdict(c1, verdict(accepted=True, reason="accepted: 1.9x", speedup=1.9,
                                         timing={"rounds_detail": detail}))
    c2 = hist.record_candidate("silu_mul", "def forward(x):\n    pass\n", "mutator", parent_id=c1)
    hist.record_verdict(c2, verdict("silu_mul", failure="no-triton", reason="no Triton kernel was launched"))
    c3 = hist.record_candidate("silu_mul", "def forward(x):\n    return x\n", "mutator")  # not judged yet

    rows = hist.attempts()
    assert [r["candidate_id"] for r in rows] == [c3, c2, c1]  # newest first
    assert rows[0]["verdict_id"] is None and rows[0]["accepted"] is None
    assert rows[2]["verdict_id"] == v2 and rows[2]["accepted"] is True and rows[2]["speedup"] == 1.9  # latest verdict
    assert rows[2]["speedup_lo"] == pytest.approx(1.805) and rows[2]["model"] == "gpt-x"
    assert [r["candidate_id"] for r in hist.attempts(op="silu_mul", limit=1)] == [c3]
    assert [r["candidate_id"] for r in hist.attempts(search="_launch_fancy_kernel")] == [c1]  # source
    assert [r["candidate_id"] for r in hist.attempts(search="Triton launched")] == [c2]  # reason
    assert hist.attempts(search='max error "0.5 AND (') == []  # FTS syntax is taken literally, not an error
    assert hist.attempts(search="nothing-like-this") == []

    assert hist.db.execute("SELECT round, baseline_s, candidate_s FROM timings WHERE verdict_id = ? ORDER BY round",
                           [v2]).fetchall() == [(0, 1.0, 0.5), (1, 1.1, 0.6)]
    stored = hist.db.execute("SELECT json FROM verdicts WHERE id = ?", [v2]).fetchone()[0]
    assert json.loads(stored)["isolation"] == {"namespace": "user+net"}  # every field kept
    assert hist.rejection_counts() == {"rmsnorm": {"mismatch": 1}, "silu_mul": {"no-triton": 1}}
    acc = hist.accepted_over_time()
    assert len(acc) == 1 and acc[0]["op"] == "rmsnorm" and acc[0]["speedup"] == 1.9 and acc[0]["proposer"] == "llm"
    assert hist.accepted_over_time("silu_mul") == []
    full = hist.candidate(c1)
    assert full["source"] == src and [v["accepted"] for v in full["verdicts"]] == [False, True]
    with pytest.raises(HistoryError, match="no candidate 999"):
        hist.record_verdict(999, verdict())


def test_registry_events_and_runs(hist):
    run = hist.start_run("loop", "rmsnorm")
    assert hist.runs()[0]["status"] == "running" and hist.runs()[0]["finished_at"] is None
    hist.finish_run(run, "ok", {"accepted": 1})
    assert hist.runs()[0]["status"] == "ok" and hist.runs()[0]["detail"] == {"accepted": 1}
    with pytest.raises(HistoryError):
        hist.finish_run(run + 10, "ok")
    hist.record_registry_event("add", "rmsnorm", entry_id="rmsnorm-abc", commit_sha="f00", device="cpu-interpreter",
                               dtype="float32", bucket="*", speedup=1.2, ok=True, detail={"why": "gate"}, extra=3)
    hist.record_registry_event("reload", None, ok=False)
    events = hist.registry_events()
    assert [e["kind"] for e in events] == ["reload", "add"] and events[0]["detail"] is None
    assert events[1]["ok"] is True and events[1]["detail"] == {"why": "gate", "extra": 3}
    assert [e["kind"] for e in hist.registry_events(op="rmsnorm")] == ["add"]
    with pytest.raises(ValueError):
        hist.record_registry_event("explode", "rmsnorm")


def test_each_record_is_committed_before_returning(hist):
    cid = hist.record_candidate("rope", "def forward(q, k, p, c):\n    pass\n", "llm")
    # another connection (as after a crash of this process) sees it at once
    other = sqlite3.connect(str(hist.path))
    assert other.execute("SELECT op FROM candidates WHERE id = ?", [cid]).fetchone() == ("rope",)
    other.close()
    assert not hist.db.conn.in_transaction


@pytest.mark.parametrize("content", [b"hello, this is a text file\n" * 3, b"SQLite format 2\x00" + b"\x00" * 100,
                                     b"SQLite"])
def test_refuses_a_file_that_is_not_a_database_and_leaves_it_untouched(tmp_path, content):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    before = path.stat().st_mtime_ns
    with pytest.raises(HistoryError, match="not an SQLite database") as err:
        History(path)
    assert "\n" not in str(err.value)
    assert path.read_bytes() == content and path.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no -wal/-shm/-journal left


def test_refuses_another_applications_database(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError, match="another application"):
        History(path)
    assert path.read_bytes() == before


def test_refuses_a_directory(tmp_path):
    with pytest.raises(HistoryError, match="directory"):
        History(tmp_path)


def test_migrates_a_v1_database_in_place_keeping_rows(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(sqlite3.connect(path, isolation_level=None))
    MIGRATIONS[0](db)  # v1 exactly as an old kernelloop wrote it: no full-text search
    db.execute("PRAGMA user_version = 1")
    db["candidates"].insert({"created_at": "2024-01-01T00:00:00+00:00", "op": "rmsnorm", "sha256": "ab" * 32,
                             "source": "def forward(x, w, eps):\n    return legacy_kernel(x)\n", "proposer": "old"})
    db["verdicts"].insert({"created_at": "2024-01-01T00:00:01+00:00", "candidate_id": 1, "op": "rmsnorm",
                           "correct": 0, "accepted": 0, "failure": "crash", "reason": "segfault in legacy launcher"})
    db["profiles"].insert({"created_at": "2024-01-01T00:00:02+00:00", "device": "old-gpu"})
    assert "candidates_fts" not in db.table_names()
    db.close()

    with History(path) as h:
        assert h.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert {"candidates_fts", "verdicts_fts"} <= set(h.db.table_names())
        rows = h.attempts()
        assert len(rows) == 1 and rows[0]["proposer"] == "old" and rows[0]["failure"] == "crash"
        assert h.latest_profile()["device"] == "old-gpu"
        # old rows were indexed by the migration, new ones by the triggers
        assert [r["candidate_id"] for r in h.attempts(search="legacy_kernel")] == [1]
        assert [r["candidate_id"] for r in h.attempts(search="segfault")] == [1]
        new = h.record_candidate("rmsnorm", "def forward(x, w, eps):\n    return brand_new(x)\n", "llm")
        assert [r["candidate_id"] for r in h.attempts(search="brand_new")] == [new]


def test_refuses_a_database_newer_than_the_code(tmp_path):
    path = tmp_path / "h.db"
    History(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError, match="newer than this kernelloop"):
        History(path)
    assert path.read_bytes() == before


WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kernelloop.history import History
    path, tag, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    Path(go.parent / f"ready-{tag}").touch()
    while not go.exists():
        time.sleep(0.005)
    with History(path) as h:  # all workers create/migrate the same fresh file at once
        for i in range(n):
            cid = h.record_candidate("rmsnorm", f"# {tag} {i}\\ndef forward(x, w, eps):\\n    pass\\n", tag)
            h.record_verdict(cid, {"op": "rmsnorm", "accepted": False, "failure": "mismatch", "reason": f"{tag} {i}"})
            if i % 50 == 0:
                h.record_registry_event("verify", "rmsnorm", entry_id=f"{tag}-{i}", ok=True)
            time.sleep(0.001)  # a loop does other work between records: let the writers interleave
""")


def test_concurrent_writers_in_separate_processes_lose_nothing(tmp_path):
    path, go, n, tags = tmp_path / "shared" / "h.db", tmp_path / "go", 200, ("w0", "w1", "w2")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(path), tag, str(n), str(go)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for tag in tags]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{t}").exists() for t in tags):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "workers did not start"
            time.sleep(0.01)
        go.touch()
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err.decode()[-2000:]
    with History(path) as h:
        db = h.db
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        for tag in tags:
            sources = {s for (s,) in db.execute("SELECT source FROM candidates WHERE proposer = ?", [tag])}
            assert sources == {f"# {tag} {i}\ndef forward(x, w, eps):\n    pass\n" for i in range(n)}
            pairs = db.execute("SELECT c.source, v.reason FROM verdicts v JOIN candidates c ON c.id = v.candidate_id"
                               " WHERE c.proposer = ?", [tag]).fetchall()
            assert len(pairs) == n and all(src.startswith(f"# {reason}\n") for src, reason in pairs)
            assert db.execute("SELECT count(*) FROM registry_events WHERE entry_id LIKE ?", [f"{tag}-%"]).fetchone()[0] == n // 50
        assert db.execute("SELECT count(*) FROM candidates_fts").fetchone()[0] == 3 * n
        order = [tag for (tag,) in db.execute("SELECT proposer FROM candidates ORDER BY id")]
        assert sum(a != b for a, b in zip(order, order[1:])) >= 10, "the writers did not actually overlap"
        db.execute("INSERT INTO candidates_fts(candidates_fts) VALUES('integrity-check')")  # raises if out of step
        assert len(h.attempts(search="w1", limit=1000)) == n

"""`agent history` (table, JSON, search, labels, outcome words) and the v2 -> v3 migration."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys

import pytest
import sqlite_utils

from kernelloop.agent.commands import history as history_cmd
from kernelloop.history import SCHEMA_VERSION, History, HistoryError
from kernelloop.history.schema import MIGRATIONS

from tests.test_history import hist, verdict  # noqa: F401  (hist: a fixture)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="command", required=True)
    history_cmd.register(sub)
    args = parser.parse_args(list(argv))
    try:
        code = args.run(args)
    except HistoryError as exc:  # what agent/cli.py does with a KernelloopError
        print(f"agent {args.command}: {exc}", file=sys.stderr)
        code = 2
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_history_absent_file_says_so_and_creates_nothing(capsys, tmp_path):
    path = tmp_path / "none" / "h.db"
    code, out, err = run_cli(capsys, "history", "--history", str(path))
    assert code == 0 and out.strip() == f"no history yet at {path}" and err == ""
    assert not path.parent.exists()


def test_cli_history_table_and_json(capsys, tmp_path):
    path = tmp_path / "h.db"
    with History(path) as h:
        c1 = h.record_candidate("rmsnorm", "def forward(x, w, eps):\n    pass\n", "llm")
        h.record_verdict(c1, verdict(accepted=True, reason="accepted: 1.400x [1.3, 1.5]", speedup=1.4))
        c2 = h.record_candidate("silu_mul", "def forward(x):\n    pass\n", "mutator")
        h.record_verdict(c2, verdict("silu_mul", failure="no-triton", reason="no Triton kernel was launched"))
    code, out, _ = run_cli(capsys, "history", "--history", str(path))
    assert code == 0
    assert "rmsnorm" in out and "silu_mul" in out and "no-triton" in out and "1.400x" in out
    assert out.index("silu_mul") < out.index("rmsnorm")  # newest first
    code, out, _ = run_cli(capsys, "history", "--history", str(path), "--json", "--op", "rmsnorm")
    data = json.loads(out)
    assert code == 0 and [d["candidate_id"] for d in data] == [c1] and data[0]["accepted"] is True
    code, out, _ = run_cli(capsys, "history", "--history", str(path), "--json", "--search", "Triton launched")
    assert [d["candidate_id"] for d in json.loads(out)] == [c2]
    code, out, _ = run_cli(capsys, "history", "--history", str(path), "--json", "--limit", "1")
    assert [d["candidate_id"] for d in json.loads(out)] == [c2]


def test_cli_history_bad_file_and_bad_args(capsys, tmp_path):
    path = tmp_path / "junk.db"
    path.write_text("not sqlite at all, just some notes\n")
    code, out, err = run_cli(capsys, "history", "--history", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "not an SQLite database" in err
    assert path.read_text() == "not sqlite at all, just some notes\n"
    with pytest.raises(SystemExit):
        run_cli(capsys, "history", "--history", str(path), "--limit", "0")
    capsys.readouterr()


def test_an_empty_file_becomes_a_history_and_a_corrupt_one_is_refused(tmp_path):
    empty = tmp_path / "empty.db"
    empty.touch()
    with History(empty) as h:
        assert h.record_candidate("rope", "x", "llm") == 1
    corrupt = tmp_path / "corrupt.db"
    content = b"SQLite format 3\x00" + bytes(range(256)) * 8
    corrupt.write_bytes(content)
    with pytest.raises(HistoryError, match="SQLite database") as err:
        History(corrupt)
    assert "\n" not in str(err.value) and corrupt.read_bytes() == content


@pytest.mark.parametrize("row, word", [
    ({"verdict_id": None}, "pending"),
    ({"verdict_id": 1, "accepted": True, "correct": True, "stage": "done"}, "accepted"),
    ({"verdict_id": 1, "accepted": False, "correct": True, "stage": "timing"}, "correct"),
    ({"verdict_id": 1, "accepted": False, "correct": False, "stage": "correctness"}, "wrong"),
    ({"verdict_id": 1, "accepted": False, "correct": False, "stage": "proposal"}, "not judged"),
])
def test_an_answer_that_never_reached_the_sandbox_is_not_called_wrong(row, word):
    from kernelloop.history.queries import outcome

    assert outcome(row) == word


# -- labels, verdict times, searchable failure codes -------------------------------------------------


def test_migrates_a_v2_database_adding_labels_and_keeping_rows(tmp_path):
    path = tmp_path / "v2.db"
    db = sqlite_utils.Database(sqlite3.connect(path, isolation_level=None))
    for migration in MIGRATIONS[:2]:  # v2 exactly as the previous kernelloop wrote it: no label column
        migration(db)
    db.execute("PRAGMA user_version = 2")
    db["candidates"].insert({"created_at": "2024-01-01T00:00:00+00:00", "op": "rmsnorm", "sha256": "ab" * 32,
                             "source": "def forward(x, w, eps):\n    pass\n", "proposer": "search"})
    db["verdicts"].insert({"created_at": "2024-01-01T00:00:09+00:00", "candidate_id": 1, "op": "rmsnorm",
                           "correct": 0, "accepted": 0, "failure": "crash", "reason": "died",
                           "json": json.dumps({"file": "rmsnorm_row_bs256_w4"})})
    db.close()
    with History(path) as h:
        assert h.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "label" in h.db["candidates"].columns_dict
        old = h.attempts()
        assert len(old) == 1 and old[0]["failure"] == "crash" and old[0]["label"] == "rmsnorm_row_bs256_w4"
        new = h.record_candidate("rmsnorm", "def forward(x, w, eps):\n    return 1\n", "llm", label="llm-round1-0")
        assert [(r["candidate_id"], r["label"]) for r in h.attempts()] == [(new, "llm-round1-0"), (1, "rmsnorm_row_bs256_w4")]


def test_cli_history_shows_the_label_and_the_verdict_time(capsys, tmp_path, monkeypatch):
    import kernelloop.history.store as store

    clock = iter(["2025-03-01T10:00:00.000000+00:00", "2025-03-01T10:00:00.000001+00:00",  # two proposals
                  "2025-03-01T10:07:30.000000+00:00"])  # the first one's verdict, minutes later
    monkeypatch.setattr(store, "now_iso", lambda: next(clock))
    path = tmp_path / "h.db"
    with History(path) as h:
        c1 = h.record_candidate("silu_mul", "def forward(x):\n    pass\n", "search", label="silu_mul_2d_b1024")
        h.record_candidate("silu_mul", "def forward(x):\n    return 1\n", "search", label="silu_mul_flat_b512")
        h.record_verdict(c1, verdict("silu_mul", failure="timeout", reason="the wall-clock limit passed"))
    code, out, _ = run_cli(capsys, "history", "--history", str(path))
    assert code == 0 and "label" in out and "silu_mul_2d_b1024" in out and "silu_mul_flat_b512" in out
    judged = next(line for line in out.splitlines() if "silu_mul_2d_b1024" in line)
    pending = next(line for line in out.splitlines() if "silu_mul_flat_b512" in line)
    assert "10:07:30" in judged and "wrong" in judged and "10:00:00" in pending and "pending" in pending


def test_search_matches_failure_codes_labels_and_outcome_words(hist):  # noqa: F811
    def ids(text: str, **kw) -> list[int]:
        return [r["candidate_id"] for r in hist.attempts(search=text, **kw)]

    timed_out = hist.record_candidate("rope", "def forward(q, k, p, c):\n    pass\n", "llm", label="llm-r1-a")
    hist.record_verdict(timed_out, verdict("rope", failure="timeout", reason="the wall-clock limit of 60 s passed"))
    cut = hist.record_candidate("rope", "def forward(q, k, p, c):\n    return 1\n", "search", label="rope_tok_b4")
    hist.record_verdict(cut, verdict("rope", failure="timing-incomplete", reason="2 of 5 rounds", correct=True))
    good = hist.record_candidate("rope", "def forward(q, k, p, c):\n    return 2\n", "search", label="rope_head_b8")
    hist.record_verdict(good, verdict("rope", accepted=True, reason="faster: 1.3x", speedup=1.3))
    assert ids("timeout") == [timed_out]  # the code, not in any reason or source
    assert ids("TIMEOUT", op="rope") == [timed_out] and ids("timeout", op="silu_mul") == []
    assert ids("timing incomplete") == ids("timing-incomplete") == [cut]
    assert ids("wrong") == [timed_out] and ids("accepted") == [good]
    assert ids("rope_head") == [good]  # the label
    assert ids("wall-clock limit") == [timed_out] and ids("faster") == [good]  # full text still works
    assert ids("nothing-like-this") == []

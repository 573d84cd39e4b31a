"""Control characters a candidate controls never reach a display raw (the display half).

A kernel's error message and output can carry terminal escape sequences (CSI, OSC 8 links, C1
controls), carriage returns and backspaces that overwrite a line, and bidi overrides that reorder
what a reader sees. kernels/display.py `safe_text` shows each as a visible escape; every place a
verdict or candidate text is displayed applies it: the `agent check` table and progress lines, the
JSON (json.dumps escapes by itself), `agent history`, `agent report`'s HTML, `agent registry show`,
the PR body, the LLM's feedback and the daemon's log lines.

Costs: one `agent check` of the three tests/sandbox_candidates/e7_*.py fixtures (~15 s on 2 cores),
the rest about a second in all.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from kernelloop.agent.progress_view import ProgressView
from kernelloop.agent.proposers.feedback import feedback_text
from kernelloop.agent.proposers.prompts import failures_text
from kernelloop.agent.render import SafeFormatter
from kernelloop.history import History
from kernelloop.kernels.display import safe_text, storable_text

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = Path(__file__).resolve().parent / "sandbox_candidates"
E7 = sorted(CANDIDATES.glob("e7_*.py"))

# One of each kind of code point that acts on a terminal or on how text reads.
HOSTILE = {
    "CSI clear screen": "\x1b[2J", "OSC 8 link": "\x1b]8;;http://x.example/\x07link\x1b]8;;\x07",
    "carriage return": "\r", "backspace": "\b", "NUL": "\x00", "DEL": "\x7f", "vertical tab": "\v",
    "C1 CSI": "\x9b31m", "C1 OSC": "\x9d0;title\x9c", "next line": "\x85",
    "bidi override RLO": "\u202e", "bidi embedding LRE": "\u202a", "bidi pop": "\u202c",
    "bidi isolate LRI": "\u2066", "bidi isolate pop": "\u2069", "right-to-left mark": "\u200f",
    "zero-width space": "\u200b", "zero-width joiner": "\u200d", "BOM": "\ufeff",
    "line separator": "\u2028", "paragraph separator": "\u2029", "tag character": "\U000e0041",
    "lone surrogate": "\ud800",
}
UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def raw_controls(text: str, allowed: str = "\n") -> list[str]:
    """The code points in `text` that a display would act on (newlines allowed where a field is multi-line)."""
    return sorted({f"U+{ord(c):04X}" for c in text if c not in allowed and unicodedata.category(c) in UNSAFE})


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_kind_of_control_becomes_a_visible_escape(name: str) -> None:
    text = f"before {HOSTILE[name]} after"
    shown = safe_text(text)
    assert raw_controls(shown, allowed="") == [] and shown.startswith("before ") and shown.endswith(" after")
    assert "\\" in shown  # visibly escaped, not dropped
    assert safe_text(shown) == shown  # idempotent: text shown twice is not escaped twice
    assert raw_controls(safe_text(text, multiline=True)) == []


def test_ordinary_text_is_kept_as_it_is() -> None:
    text = "naïve café 中文 עברית emoji 🚀 a\u00a0b tabs\tand C:\\path\\x1b literal"
    assert safe_text(text, multiline=True) == text
    assert safe_text("line 1\nline 2\r\n\tindented", multiline=True) == "line 1\nline 2\n\tindented"
    assert safe_text("line 1\nline 2\ttab") == "line 1\\nline 2\\ttab"  # one line where one line is shown
    assert safe_text(None) == "None" and safe_text(3.5) == "3.5"


def test_storable_text_replaces_only_lone_surrogates() -> None:
    text = "ok 🚀 \ud83d cut emoji"
    stored = storable_text(text)
    stored.encode("utf-8")  # encodes now
    assert stored.startswith("ok 🚀 ") and stored.endswith(" cut emoji") and "\ufffd" in stored
    assert storable_text("plain") == "plain"


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict:
    """`agent check` (table mode: the table, then one JSON line per candidate) on the e7 fixtures."""
    tmp = tmp_path_factory.mktemp("display")
    history = tmp / "history.db"
    proc = subprocess.run([sys.executable, "-m", "kernelloop.agent.cli", "check", "rmsnorm", *map(str, E7),
                           "--no-timing", "--dtypes", "float32", "--history", str(history)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"stdout": proc.stdout, "stderr": proc.stderr, "history": history, "tmp": tmp}


def test_agent_check_table_progress_and_json_are_clean(checked: dict) -> None:
    stdout, stderr = checked["stdout"], checked["stderr"]
    assert raw_controls(stdout) == [] and raw_controls(stderr) == []
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]  # exact JSON, one per file
    assert [Path(v["file"]).name for v in lines] == [p.name for p in E7]
    by_name = {Path(v["file"]).name: v for v in lines}
    error, load, output = (by_name[f"e7_escape_in_{k}.py"] for k in ("error", "import_error", "output"))
    assert (error["failure"], load["failure"], output["failure"]) == ("raised", "load", "raised")
    # the whole message is shown, type first: the carriage return did not hide what came before it
    assert "forward raised ValueError: \\x1b[2J\\x1b[H\\x1b]8;;http://attacker.example/\\x07" in error["reason"]
    assert "\\rACCEPTED 9.99x\\x08" in error["reason"] and "\\u202eevil\\u202c" in error["reason"]
    assert "RuntimeError: \\x1b[31mred" in load["reason"] and "\\r\\x00done" in load["reason"]
    assert "\\x9b2J\\x9d0;title\\x9c \\u2028second line\\u2029 \\x7f" in output["reason"]
    assert "\\x1b[2J\\x1b[3J" in output["log_tail"] and "100%\\r\\x1b[1A" in output["log_tail"]
    assert "\n" in output["log_tail"]  # a multi-line field keeps its lines
    for v in lines:
        assert raw_controls(v["reason"], allowed="") == [] and raw_controls(v["log_tail"]) == []
    table = stdout[: stdout.index("{")]
    assert "ValueError: \\x1b[2J" in table and "\\u202eevil" in table


def _record_raw(history: Path) -> None:
    """A verdict with raw control characters, as a database written before they were escaped holds."""
    with History(history) as hist:
        hist.record_attempt("rmsnorm", "def forward(x, weight, eps):\n    return x  # \u202e\n", "llm",
                            {"op": "rmsnorm", "device": "cpu-interpreter", "correct": False, "accepted": False,
                             "failure": "raised", "reason": "raw \x1b[2J\x1b]8;;http://x/\x07 \u202egnp.", "stage": "correctness",
                             "log_tail": "out \x1b[1A\r\x08"}, label="old \x1b[31mlabel", model="m\u202e")


def test_history_table_json_and_report_are_clean(checked: dict, capsys: pytest.CaptureFixture[str]) -> None:
    from kernelloop.agent import cli
    from kernelloop.history.report import _attempts_table

    history = checked["history"]
    _record_raw(history)
    assert cli.main(["history", "--history", str(history)]) == 0
    table = capsys.readouterr().out
    assert raw_controls(table) == [] and "raw \\x1b[2J" in table and "old \\x1b[31mlabel" in table
    assert cli.main(["history", "--json", "--history", str(history)]) == 0
    as_json = capsys.readouterr().out
    assert raw_controls(as_json) == []
    assert any(r["reason"].startswith("raw \x1b[2J") for r in json.loads(as_json))  # data intact, escaped by JSON
    with History(history) as hist:
        html = _attempts_table(hist.attempts())  # agent report's table of attempts (the figures show counts)
    assert raw_controls(html) == [] and "raw \\x1b[2J" in html and "\\u202egnp." in html


def test_feedback_and_earlier_failures_quote_the_candidate_escaped() -> None:
    verdict = {"failure": "raised", "reason": "boom \x1b[2J\r\u202e", "log_tail": "line 1 \x1b[1A\nline 2 \x08"}
    text = feedback_text(verdict)
    assert raw_controls(text) == [] and "boom \\x1b[2J\\r\\u202e" in text and "line 1 \\x1b[1A\nline 2 \\x08" in text
    earlier = failures_text([{"failure": "mismatch\x1b[0m", "reason": "off \u2066by\u2069 one"}])
    assert raw_controls(earlier) == [] and "off \\u2066by\\u2069 one" in earlier


def test_pr_body_shows_registry_fields_escaped(tmp_path: Path) -> None:
    from kernelloop.agent.pr import read_registry
    from kernelloop.agent.pr_body import render_body, title_for
    from kernelloop.kernels.registry import Registry
    from kernelloop.kernels.registry.entry import Provenance

    reg = Registry(tmp_path / "registry")
    entry = reg.add("rmsnorm", "def forward(x, weight, eps):\n    return x\n", device="cpu-interpreter",
                    dtype="float32", bucket="*", speedup=1.5, speedup_ci=(1.2, 1.8),
                    provenance=Provenance("llm\x1b]8;;http://x/\x07", model="gpt\u202e-evil", prompt_hash="\r\x08")).entry
    body = render_body([entry], read_registry(reg), {entry.id: {"shape": {"tokens": 1}, "dtype": "float32\x1b[0m"}})
    assert raw_controls(body) == [] and "llm\\x1b]8;;http://x/\\x07" in body and "gpt\\u202e-evil" in body
    assert raw_controls(title_for([entry]), allowed="") == []


def test_registry_show_prints_a_trojan_source_visibly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernelloop.agent import cli
    from kernelloop.kernels.registry import Registry
    from kernelloop.kernels.registry.entry import Provenance

    reg = Registry(tmp_path / "registry")
    source = 'def forward(x, weight, eps):\n    s = "admin\u202e \u2066// check\u2069 \u2066"  # \x1b[8m\n    return x\n'
    entry = reg.add("rmsnorm", source, device="cpu-interpreter", dtype="float32", bucket="*", speedup=1.5,
                    speedup_ci=(1.2, 1.8), provenance=Provenance("search")).entry
    assert cli.main(["registry", "show", entry.id, "--registry", str(reg.path)]) == 0
    shown = capsys.readouterr().out
    assert raw_controls(shown) == [] and '"admin\\u202e \\u2066// check\\u2069' in shown


def test_progress_lines_and_daemon_log_lines_are_escaped() -> None:
    lines: list[str] = []
    view = ProgressView(lines.append, live=False)
    view("  llm round 1: raised: boom \x1b[2J\r\u202e")
    assert lines == ["  llm round 1: raised: boom \\x1b[2J\\r\\u202e"]
    record = logging.LogRecord("kernelloop.daemon", logging.INFO, __file__, 1, "run %s: %s (%s)",
                               (7, "no-winner", "reason \x1b]8;;http://x/\x07\u2066"), None)
    shown = SafeFormatter("%(levelname)s %(message)s").format(record)
    assert shown == "INFO run 7: no-winner (reason \\x1b]8;;http://x/\\x07\\u2066)"

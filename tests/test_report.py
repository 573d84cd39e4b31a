"""`agent report`: one self-contained HTML file with four embedded figures, or "no data yet"."""

from __future__ import annotations

import argparse
import base64
import re
import sys

from kernelloop.agent.commands import report as report_cmd
from kernelloop.history import History, HistoryError
from kernelloop.history.report import REPORT_NAME

from tests.test_history import PROFILE, verdict

IMG = '<img src="data:image/png;base64,'


def run_report(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="command", required=True)
    report_cmd.register(sub)
    args = parser.parse_args(["report", *argv])
    try:
        code = args.run(args)
    except HistoryError as exc:  # what agent/cli.py does with a KernelloopError
        print(f"agent report: {exc}", file=sys.stderr)
        code = 2
    out, err = capsys.readouterr()
    return code, out, err


def fill(path) -> None:
    with History(path) as h:
        h.record_profile(PROFILE)
        h.record_profile({**PROFILE, "rows": [
            {"name": "fused_add_rmsnorm", "kind": "op", "calls": 10, "total_s": 0.5, "share": 0.25, "roofline_pct": 40.0},
            {"name": "decode_attention", "kind": "op", "calls": 10, "total_s": 1.0, "share": 0.5, "roofline_pct": 7.5},
            {"name": "sampling <&>", "kind": "other", "calls": 10, "total_s": 0.5, "share": 0.25},
        ]})
        for i, speedup in enumerate((1.2, 1.5)):
            c = h.record_candidate("fused_add_rmsnorm", f"def forward(x, r, w, eps):\n    pass  # {i}\n", "llm")
            h.record_verdict(c, verdict("fused_add_rmsnorm", accepted=True, reason=f"accepted: {speedup}x",
                                        speedup=speedup))
        c = h.record_candidate("decode_attention", "def forward(q, k, v, p, i, s):\n    pass\n", "llm")
        h.record_verdict(c, verdict("decode_attention", accepted=True, reason="accepted: 2.0x", speedup=2.0))
        for failure in ("mismatch", "mismatch", "no-triton", "not-faster"):
            c = h.record_candidate("silu_mul", "def forward(x):\n    pass\n", "mutator")
            h.record_verdict(c, verdict("silu_mul", failure=failure, reason=f"rejected: {failure}"))
        fill_registry(h)


GATE = {"ok": True, "reason": "greedy same, KL 1e-06 <= 0.01, tokens/s x1.04", "kl_before": 2e-7, "kl_after": 1e-6,
        "greedy_same": True, "tps_before": 0.13, "tps_after": 0.135, "tps_ratio": 1.04, "tps_interval": [0.99, 1.09],
        "speed_rounds": 3,
        "runaway": [{"label": f"prompt {i}, greedy", "runaway": False, "before": {"repeats": 3}, "after": {"repeats": 2 + i}}
                    for i in range(3)],
        "invariance": [{"prompt": i, "before": None, "after": None, "new": False, "cached": 5} for i in range(4)]}


def fill_registry(h: History) -> None:
    """A tune run that committed and kept a kernel, and one whose gate failed and was rolled back."""
    slot = {"device": "cpu-interpreter", "dtype": "float32", "bucket": "hidden=64,tokens=2-16"}
    run = h.start_run("tune", "fused_add_rmsnorm")
    h.record_registry_event("add", "fused_add_rmsnorm", entry_id="farms-1", commit_sha="c0ffee" * 4, speedup=1.2,
                            ok=True, **slot)
    h.record_registry_event("reload", "fused_add_rmsnorm", entry_id="farms-1", ok=True, run_id=run,
                            detail={"changed": {"fused_add_rmsnorm": {}}})
    h.record_registry_event("gate", "fused_add_rmsnorm", entry_id="farms-1", ok=True, run_id=run, detail=GATE)
    h.finish_run(run, "winner", {"reason": "accepted: 1.2x", "candidates": 3, "rounds": 1})
    run = h.start_run("tune", "decode_attention")
    h.record_registry_event("add", "decode_attention", entry_id="dattn-1", commit_sha="beef" * 5, speedup=2.0,
                            ok=True, **slot)
    failed = {**GATE, "ok": False, "reason": "KL 0.5 > 0.01", "kl_after": 0.5, "greedy_same": False,
              "tps_interval": None, "runaway": [{"label": "prompt 0, seed 1", "runaway": True,
                                                 "before": {"repeats": 4}, "after": {"repeats": 40}}],
              "invariance": [{"prompt": 2, "before": None, "after": "in a batch from token 3 (7 alone, 9 batch)",
                              "new": True, "cached": 5}]}
    h.record_registry_event("gate", "decode_attention", entry_id="dattn-1", ok=False, run_id=run, detail=failed)
    h.record_registry_event("rollback", "decode_attention", entry_id="dattn-1", ok=True, run_id=run,
                            detail={"why": "KL 0.5 > 0.01"})
    h.finish_run(run, "gate-failed", {"reason": "rolled back: KL 0.5 > 0.01", "candidates": 1, "rounds": 1})


def test_report_has_four_figures_the_ops_and_no_external_references(capsys, tmp_path):
    hist, out = tmp_path / "h.db", tmp_path / "out"
    fill(hist)
    code, stdout, err = run_report(capsys, "--history", str(hist), "--out", str(out))
    target = out / REPORT_NAME
    assert code == 0 and stdout.strip() == str(target) and err == ""
    page = target.read_text(encoding="utf-8")
    assert page.count(IMG) == 4 and "<svg" not in page
    assert "no data yet" not in page
    for png in re.findall(r'data:image/png;base64,([A-Za-z0-9+/=]+)"', page):
        assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"https?://", page) and "src=\"http" not in page and "<link" not in page
    assert "<script" not in page
    for op in ("fused_add_rmsnorm", "decode_attention", "silu_mul", "no-triton", "mismatch"):
        assert op in page
    assert "sampling &lt;&amp;&gt;" in page and "sampling <&>" not in page  # escaped
    assert "partial profile: stopped after 8 steps" in page
    # the latest profile is the one shown, not the first
    assert "roofline" in page and page.index("decode_attention") > 0
    assert "<td>rmsnorm</td>" not in page.split("Latest profile rows")[1].split("Last attempts")[0]


def test_empty_and_absent_history_render_no_data_yet(capsys, tmp_path):
    empty = tmp_path / "empty.db"
    History(empty).close()
    code, stdout, _ = run_report(capsys, "--history", str(empty), "--out", str(tmp_path / "a"))
    page = (tmp_path / "a" / REPORT_NAME).read_text()
    assert code == 0 and page.count("no data yet") >= 6 and IMG not in page
    absent = tmp_path / "never" / "h.db"
    code, stdout, _ = run_report(capsys, "--history", str(absent), "--out", str(tmp_path / "b"))
    assert code == 0 and "no data yet" in (tmp_path / "b" / REPORT_NAME).read_text()
    assert not absent.parent.exists()  # a report never creates a history


def test_partial_data_draws_what_it_has(capsys, tmp_path):
    hist = tmp_path / "h.db"
    with History(hist) as h:  # a profile without roofline figures, and one rejection: two figures
        h.record_profile({"device": "cpu", "rows": [{"name": "rope", "kind": "op", "share": 1.0}]})
        h.record_verdict(h.record_candidate("rope", "x", "llm"), verdict("rope", failure="static", reason="line 1"))
    code, _, _ = run_report(capsys, "--history", str(hist), "--out", str(tmp_path / "o"))
    page = (tmp_path / "o" / REPORT_NAME).read_text()
    assert code == 0 and page.count(IMG) == 2 and page.count("no data yet") == 5  # 2 figures, gates, events, runs


def test_report_refuses_a_non_database(capsys, tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00\x01 definitely not sqlite")
    code, stdout, err = run_report(capsys, "--history", str(junk), "--out", str(tmp_path / "o"))
    assert code == 2 and stdout == "" and "not an SQLite database" in err and len(err.strip().splitlines()) == 1
    assert junk.read_bytes() == b"\x00\x01 definitely not sqlite"

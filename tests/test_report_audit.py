"""The report's shadow-audit section: shown per commit once the audit recorded something, absent before."""

from __future__ import annotations

from kernelloop.history import History
from kernelloop.history.report import collect, render


def test_the_section_appears_with_audit_data_and_names_the_rollback(tmp_path) -> None:
    with History(tmp_path / "h.db") as h:
        assert "Shadow audit" not in render(collect(h))
        for i in range(3):
            h.record_audit_sample("a" * 40, {"agreement": 1.0, "kl": 0.001, "loop": False, "json_asked": False},
                                  instance="q1", seq=i)
        for i in range(3, 7):
            h.record_audit_sample("b" * 40, {"agreement": 0.25, "kl": None, "loop": i == 3, "json_asked": True,
                                             "json_valid": i > 4}, instance="q1", seq=i)
        h.record_audit_sample("b" * 40, {}, instance="q1", seq=7)  # the reference could not score it
        h.record_registry_event("rollback", "rmsnorm", ok=True, detail={"audited_commit": "b" * 40,
                                                                        "reason": "greedy agreement 0.250 < 0.9"})
        assert h.audit_cursor("q1") == 8 and h.audit_cursor("q2") == 0
        page = render(collect(h))
    section = page[page.index("Shadow audit"):]
    assert section.index("aaaaaaaaaa") < section.index("bbbbbbbbbb")
    assert "rolled back: greedy agreement 0.250 &lt; 0.9" in section and "held" in section
    row_b = section[section.index("bbbbbbbbbb"):].split("</tr>")[0]
    assert '<td class="num">4</td>' in row_b and "0.250" in row_b and "25%" in row_b and "50%" in row_b

"""The report's shadow-audit section: what the engine served, re-scored against the float32 reference, per
registry commit over time (agent/auditor.py records it). Absent (an empty string) until the audit ran."""

from __future__ import annotations

import html
from typing import Any, Sequence

AUDIT_ROWS = 20_000  # audited requests the section reads (the newest)


def _mean(values: Sequence[Any]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def _cell(value: float | None, fmt: str) -> str:
    return '<td class="num">-</td>' if value is None else f'<td class="num">{format(value, fmt)}</td>'


def audit_section(samples: list[dict[str, Any]], events: list[dict[str, Any]]) -> str:
    """HTML: one row per registry commit, in the order the audit first saw it; '' when nothing was audited.
    `samples`: History.audit_samples() rows, oldest first; `events`: registry events (rollbacks by the
    audit name the commit they undid in detail.audited_commit)."""
    if not samples:
        return ""
    by_commit: dict[str, list[dict[str, Any]]] = {}
    for row in samples:
        by_commit.setdefault(row.get("commit_sha") or "", []).append(row)
    undone = {(e.get("detail") or {}).get("audited_commit"): (e.get("detail") or {}).get("reason", "")
              for e in events if e.get("kind") == "rollback" and isinstance(e.get("detail"), dict)}
    lines = ["<h2>Shadow audit of served traffic</h2>",
             '<p class="meta">Requests the engine served, sampled at its --audit-rate and re-scored with the '
             "float32 reference: greedy agreement, KL per token (requests that asked for logprobs), loops, JSON "
             "validity (requests that asked for JSON), per registry commit.</p>",
             "<table><tr><th>commit</th><th>first audited</th><th>last audited</th><th>requests</th>"
             "<th>greedy agreement</th><th>KL / token</th><th>loop rate</th><th>JSON valid</th><th>audit</th></tr>"]
    for commit, rows in by_commit.items():
        scored = [r for r in rows if r.get("loop") is not None]
        asked = [r for r in scored if r.get("json_asked")]
        verdict = (f'<span class="bad">rolled back: {html.escape(str(undone[commit]))}</span>' if commit in undone
                   else '<span class="ok">held</span>')
        lines.append(
            f"<tr><td>{html.escape(commit[:10]) or 'no registry commit'}</td>"
            f"<td>{html.escape(str(rows[0].get('created_at', ''))[:19])}</td>"
            f"<td>{html.escape(str(rows[-1].get('created_at', ''))[:19])}</td><td class=\"num\">{len(scored)}</td>"
            + _cell(_mean([r.get("agreement") for r in scored]), ".3f") + _cell(_mean([r.get("kl") for r in scored]), ".4f")
            + _cell(sum(bool(r.get("loop")) for r in scored) / len(scored) if scored else None, ".0%")
            + _cell(_mean([float(bool(r.get("json_valid"))) for r in asked]) if asked else None, ".0%")
            + f"<td>{verdict}</td></tr>")
    lines.append("</table>")
    return "\n".join(lines)

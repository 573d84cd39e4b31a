"""The HTML report: one self-contained file (figures as base64 PNG, inline CSS, no external URL).

`collect(history_or_None)` reads what the report shows; `render(data)` turns it into HTML;
`write_report(path, out_dir)` does both without creating a history file that does not exist.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from history import charts
from history.db import now_iso
from history.queries import outcome
from history.store import History

REPORT_NAME = "kernelloop-report.html"
NO_DATA = '<p class="empty">no data yet</p>'
ATTEMPT_ROWS = 30

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 70em;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; } .empty { color: #888; font-style: italic; } .meta { color: #555; }
.warn { color: #a15c00; } .ok { color: #2e7d32; } .bad { color: #b3261e; }
"""


@dataclass
class ReportData:
    """Everything the report shows; empty by default (a history with nothing in it yet)."""

    source: str = ""
    generated_at: str = field(default_factory=now_iso)
    profile: dict[str, Any] | None = None
    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejections: dict[str, dict[str, int]] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def accepted_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for a in self.accepted:
            counts[a["op"] or "?"] = counts.get(a["op"] or "?", 0) + 1
        return counts


def collect(hist: History | None, source: str = "") -> ReportData:
    """Read the report's data from an open history (None: an empty report)."""
    if hist is None:
        return ReportData(source=source)
    return ReportData(source=source or str(hist.path), profile=hist.latest_profile(),
                      accepted=hist.accepted_over_time(), rejections=hist.rejection_counts(),
                      attempts=hist.attempts(limit=ATTEMPT_ROWS))


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: Any, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f'<td class="num">{_e(v)}</td>' if i in numeric else f"<td>{_e(v)}</td>"
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(title: str, draw: Callable[[], bytes | None], alt: str) -> str:
    png = draw()
    if png is None:
        return f"<h2>{_e(title)}</h2>{NO_DATA}"
    data = base64.b64encode(png).decode("ascii")
    return f'<h2>{_e(title)}</h2><img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _profile_summary(p: dict[str, Any]) -> str:
    facts = [("when", p.get("created_at")), ("device", p.get("device")), ("engine", p.get("engine")),
             ("model", p.get("model")), ("kernels", p.get("kernels")), ("steps", p.get("steps")),
             ("requests", p.get("requests")), ("output tokens", p.get("output_tokens")),
             ("tokens/s", _num(p.get("tokens_per_second"), "{:.2f}")),
             ("TTFT median", _num(p.get("ttft_ms_median"), "{:.1f} ms")),
             ("TPOT median", _num(p.get("tpot_ms_median"), "{:.1f} ms")),
             ("prefix hit rate", _num(p.get("prefix_hit_rate"), "{:.1%}")),
             ("wall / busy", f"{_num(p.get('wall_seconds'), '{:.2f}')} s / {_num(p.get('busy_seconds'), '{:.2f}')} s")]
    text = " &middot; ".join(f"{_e(k)}: <b>{_e(v)}</b>" for k, v in facts if v not in (None, ""))
    if p.get("partial"):
        text += f'<br><span class="warn">partial profile: {_e(p.get("partial_reason") or "no reason given")}</span>'
    return f'<p class="meta">{text}</p>'


def _profile_table(p: dict[str, Any] | None) -> str:
    if not p or not p.get("rows"):
        return NO_DATA
    rows = [(r.get("name"), r.get("kind"), r.get("calls"), _num(r.get("total_s"), "{:.4f}"),
             _num(r.get("mean_us"), "{:.1f}"), _num(r.get("share"), "{:.1%}"), r.get("variant"),
             _num(r.get("bytes_per_s") and r["bytes_per_s"] / 1e9, "{:.2f}"), _num(r.get("roofline_pct"), "{:.1f}%"),
             ", ".join(sorted({str(s.get("bucket")) for s in (r.get("shapes") or [])})))
            for r in p["rows"]]
    return _table(("op", "kind", "calls", "total s", "mean us", "share", "variant", "GB/s", "roofline", "buckets"),
                  rows, numeric=(2, 3, 4, 5, 7, 8))


def _attempts_table(attempts: list[dict[str, Any]]) -> str:
    if not attempts:
        return NO_DATA
    rows = [((a.get("created_at") or "")[:19].replace("T", " "), a.get("op"), a.get("proposer"),
             (a.get("sha256") or "")[:10], outcome(a), _num(a.get("speedup"), "{:.3f}x"), a.get("failure"),
             a.get("reason")) for a in attempts]
    return _table(("time (UTC)", "op", "proposer", "sha256", "verdict", "speedup", "failure", "reason"), rows,
                  numeric=(5,))


def render(data: ReportData) -> str:
    """The whole report as one HTML document."""
    p = data.profile
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>kernelloop report</title>", f"<style>{CSS}</style></head><body>",
        "<h1>kernelloop report</h1>",
        f'<p class="meta">history: {_e(data.source) or "none"} &middot; generated {_e(data.generated_at)}</p>',
        "<h2>Latest profile</h2>", _profile_summary(p) if p else NO_DATA,
        _figure("Op time shares", lambda: charts.time_shares(p), "share of time per op"),
        _figure("Accepted kernels: speedup over time", lambda: charts.speedups_over_time(data.accepted),
                "speedup of accepted kernels per op over time"),
        _figure("Percent of roofline per op", lambda: charts.roofline(p), "percent of roofline per op"),
        _figure("Attempts and rejection reasons per op",
                lambda: charts.attempts_by_op(data.accepted_counts, data.rejections), "verdicts per op by outcome"),
        "<h2>Latest profile rows</h2>", _profile_table(p),
        f"<h2>Last attempts (up to {ATTEMPT_ROWS})</h2>", _attempts_table(data.attempts),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_report(history_path: Path, out_dir: Path) -> Path:
    """Render the history at `history_path` (absent: an empty report; it is not created) into
    `out_dir`/kernelloop-report.html, written atomically. Returns the file's path."""
    if history_path.exists():
        with History(history_path) as hist:
            data = collect(hist, str(history_path))
    else:
        data = collect(None, f"{history_path} (absent)")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / REPORT_NAME
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(render(data), encoding="utf-8")
    tmp.replace(target)
    return target

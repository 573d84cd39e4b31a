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

from kernelloop.history import charts
from kernelloop.history.charts import INTERPRETER, format_pct
from kernelloop.history.db import now_iso
from kernelloop.history.queries import attempt_time, outcome
from kernelloop.history.report_audit import AUDIT_ROWS, audit_section
from kernelloop.history.report_quantize import quantize_section
from kernelloop.history.store import History
from kernelloop.kernels.device import Fingerprint
from kernelloop.kernels.display import safe_text

REPORT_NAME = "kernelloop-report.html"
NO_DATA = '<p class="empty">no data yet</p>'
ATTEMPT_ROWS = 30
EVENT_ROWS = 50
RUN_ROWS = 30
ALL_EVENTS = 100_000  # the served-over-time chart replays every add and rollback
INTERPRETER_BADGE = ('<span class="badge">cpu-interpreter: measured through Triton\'s CPU interpreter, '
                     'not GPU figures</span>')
CELL_BADGE = '<span class="badge">interpreter, not GPU</span>'  # the same, short enough for a table cell

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 70em;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; } .empty { color: #888; font-style: italic; } .meta { color: #555; }
.warn { color: #a15c00; } .ok { color: #2e7d32; } .bad { color: #b3261e; }
.badge { display: inline-block; background: #fff3e0; color: #a15c00; border: 1px solid #e0a040;
         border-radius: 4px; padding: 0.1em 0.5em; font-size: 0.75em; font-weight: 600; margin-left: 0.5em; }
"""


@dataclass
class ReportData:
    """Everything the report shows; empty by default (a history with nothing in it yet)."""

    source: str = ""
    generated_at: str = field(default_factory=now_iso)
    profile: dict[str, Any] | None = None  # History.latest_profile(): the stored columns (kernelloop/common/profile_contract.py)
    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejections: dict[str, dict[str, int]] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # registry events, oldest first
    runs: list[dict[str, Any]] = field(default_factory=list)    # tune runs, newest first (+ "judges": run_judges)
    audit: list[dict[str, Any]] = field(default_factory=list)   # shadow-audit scores, oldest first

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
                      attempts=hist.attempts(limit=ATTEMPT_ROWS), events=hist.registry_events(limit=ALL_EVENTS)[::-1],
                      runs=[{**r, "judges": hist.run_judges(r["id"])} for r in hist.runs(limit=RUN_ROWS, command="tune")],
                      audit=hist.audit_samples(limit=AUDIT_ROWS))


def _e(value: Any) -> str:
    """HTML-escaped and display-safe: a candidate's control and bidi characters are shown, not obeyed."""
    return html.escape(safe_text("" if value is None else value))


def _num(value: Any, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def _time(text: str | None) -> str:
    return (text or "")[:19].replace("T", " ")


def _ms(value: float | None) -> str:
    """Milliseconds, as seconds once they pass one (interpreter TTFTs run to minutes)."""
    return "" if value is None else f"{value / 1000:.1f} s" if value >= 1000 else f"{value:.1f} ms"


def _badge(device: Fingerprint | None, badge: str = INTERPRETER_BADGE) -> str:
    return badge if device == INTERPRETER else ""


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = (),
           raw: Sequence[int] = ()) -> str:
    """An HTML table; cells are escaped except the columns in `raw` (markup made here)."""
    def cell(i: int, v: Any) -> str:
        return ('<td class="num">' if i in numeric else "<td>") + (str(v) if i in raw else _e(v)) + "</td>"
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(title: str, draw: Callable[[], bytes | None], alt: str, badge: str = "", note: str = "") -> str:
    png = draw()
    if png is None:
        return f"<h2>{_e(title)}</h2>{NO_DATA}"
    data = base64.b64encode(png).decode("ascii")
    caption = f'<p class="meta">{_e(note)}</p>' if note else ""
    return f'<h2>{_e(title)}{badge}</h2>{caption}<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _profile_summary(p: dict[str, Any]) -> str:
    facts = [("when", p.get("created_at")), ("device", p.get("device")), ("engine", p.get("engine")),
             ("model", p.get("model")), ("kernels", p.get("kernels")), ("steps", p.get("steps")),
             ("requests", p.get("requests")), ("output tokens", p.get("output_tokens")),
             ("tokens/s", _num(p.get("tokens_per_second"), "{:.2f}")),
             ("TTFT median", _ms(p.get("ttft_ms_median"))), ("TPOT median", _ms(p.get("tpot_ms_median"))),
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
             _num(r.get("mean_us"), "{:.1f}"), "" if r.get("share") is None else format_pct(100 * r["share"]),
             r.get("variant"), _num(r.get("bytes_per_s") and r["bytes_per_s"] / 1e9, "{:.2f}"),
             "" if r.get("roofline_pct") is None else format_pct(r["roofline_pct"]),
             ", ".join(sorted({str(s.get("bucket")) for s in (r.get("shapes") or [])})))
            for r in p["rows"]]
    return _table(("op", "kind", "calls", "total s", "mean us", "share", "variant", "GB/s", "roofline", "buckets"),
                  rows, numeric=(2, 3, 4, 5, 7, 8))


def _attempts_table(attempts: list[dict[str, Any]]) -> str:
    if not attempts:
        return NO_DATA
    rows = [(_time(attempt_time(a)), a.get("op"), a.get("proposer"), a.get("label"), (a.get("sha256") or "")[:10],
             outcome(a), _num(a.get("speedup"), "{:.3f}x"), a.get("failure"), a.get("reason")) for a in attempts]
    return _table(("time (UTC)", "op", "proposer", "label", "sha256", "verdict", "speedup", "failure", "reason"),
                  rows, numeric=(6,))


def _result(ok: bool | None) -> str:
    return "" if ok is None else '<span class="ok">ok</span>' if ok else '<span class="bad">failed</span>'


def _event_what(e: dict[str, Any]) -> str:
    """One line on what an event did, from its kind's detail."""
    d = e.get("detail") or {}
    if e["kind"] == "add":
        speedup, commit = _num(e.get("speedup"), "{:.3f}x"), (e.get("commit_sha") or "")[:10]
        return f"{e.get('dtype')} [{e.get('bucket')}] at {speedup}, commit {commit}"
    if e["kind"] == "reload":
        return "changed: " + (", ".join(sorted(d.get("changed") or {})) or "nothing")
    if e["kind"] == "gate":
        return f"{'passed' if e.get('ok') else 'FAILED'}: {d.get('reason', '')}"
    return str(d.get("why") or d.get("reason") or (e.get("commit_sha") or "")[:10])


def _events_table(events: list[dict[str, Any]]) -> str:
    if not events:
        return NO_DATA
    rows = [(_time(e.get("created_at")), e["kind"], e.get("op"), e.get("entry_id"),
             _e(e.get("device")) + _badge(e.get("device"), CELL_BADGE), _result(e.get("ok")), _event_what(e))
            for e in events[::-1][:EVENT_ROWS]]
    return _table(("time (UTC)", "event", "op", "entry", "device", "result", "what"), rows, raw=(4, 5))


def _gates_table(events: list[dict[str, Any]]) -> str:
    device = {e.get("entry_id"): e.get("device") for e in events if e["kind"] == "add"}
    gates = [e for e in events[::-1] if e["kind"] == "gate"]
    if not gates:
        return NO_DATA
    rows = []
    for g in gates:
        d, dev = g.get("detail") or {}, device.get(g.get("entry_id"))
        interval = d.get("tps_interval")
        ratio = _num(d.get("tps_ratio"), "{:.3f}x") + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
        greedy = d.get("greedy_same")
        rows.append((_time(g.get("created_at")), _e(g.get("op")), _e(g.get("entry_id")), _e(dev) + _badge(dev, CELL_BADGE),
                     _result(d.get("ok", g.get("ok"))), "" if greedy is None else "yes" if greedy else "no",
                     f"{_num(d.get('kl_before'), '{:.3g}')} → {_num(d.get('kl_after'), '{:.3g}')}",
                     f"{_num(d.get('tps_before'), '{:.3g}')} → {_num(d.get('tps_after'), '{:.3g}')}", _e(ratio),
                     _e(_divergences(d.get("invariance"))), _e(_loops(d.get("runaway"))), _e(_tasks(d.get("tasks"))),
                     _e(d.get("speed_rounds")),
                     _e(d.get("reason"))))
    return _table(("time (UTC)", "op", "entry", "device", "result", "greedy same", "KL before → after",
                   "tokens/s before → after", "tokens/s ratio [95% interval]", "batch invariance (alone, batch, cache hit)",
                   "runaway (longest loop before → after)", "tasks (accuracy before → after)", "rounds", "reason"),
                  rows, numeric=(6, 7, 8, 12), raw=tuple(range(14)))


def _divergences(rows: list[dict[str, Any]] | None) -> str:
    """The gate's batch-invariance check in one cell: new divergences first, then those the model had."""
    if not rows:
        return "-"
    new = [r for r in rows if r.get("new")]
    old = sum(1 for r in rows if r.get("before"))
    head = (f"{len(new)} new: prompt {new[0]['prompt']} {new[0]['after']}" if new
            else f"none new ({len(rows)} prompts)")
    return head + (f"; {old} diverged before" if old else "")


def _tasks(tasks: dict[str, Any] | None) -> str:
    """The gate's task audit in one cell: passes before → after over the items scored both times, the interval."""
    if not tasks:
        return "-"
    pairs = [(b, a) for b, a in zip(tasks["before"], tasks["after"]) if b is not None and a is not None]
    lo, hi = tasks["interval"]
    return (f"{sum(b for b, _ in pairs)}/{len(pairs)} → {sum(a for _, a in pairs)}/{len(pairs)} "
            f"[{lo:.2f}, {hi:.2f}]" + (f", {tasks['skipped']} skipped" if tasks.get("skipped") else ""))


def _loops(rows: list[dict[str, Any]] | None) -> str:
    """The gate's runaway check in one cell: new loops, and the most repeats before and after."""
    if not rows:
        return "-"
    new = sum(1 for r in rows if r.get("runaway"))
    most = [max(r[side]["repeats"] for r in rows) for side in ("before", "after")]
    return f"{f'{new} new loop' + ('s' if new > 1 else '') if new else 'none'} ({most[0]} → {most[1]} repeats, {len(rows)} generations)"


def _judges(judges: list[dict[str, Any]] | None) -> str:
    """Which cluster actors judged a run's candidates: 'actor 0 @ node (device): 3, 1 retried; ...'; 'here'
    when its sandbox was this process's."""
    parts = [f"actor {j['judged_by'].get('actor')} @ {j['judged_by'].get('node')} ({j['judged_by'].get('device')}): "
             f"{j['verdicts']}" + (f", {j['retried']} retried" if j.get("retried") else "") for j in judges or []]
    return "; ".join(parts) or "here"


def _runs_table(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return NO_DATA
    rows = [(r["id"], r.get("op"), r.get("status"), (r.get("detail") or {}).get("reason"),
             (r.get("detail") or {}).get("candidates"), (r.get("detail") or {}).get("rounds"), _judges(r.get("judges")),
             _time(r.get("started_at")), _time(r.get("finished_at"))) for r in runs]
    return _table(("run", "op", "status", "reason", "candidates", "rounds", "judged by", "started (UTC)",
                   "finished (UTC)"), rows, numeric=(0, 4, 5))


def render(data: ReportData) -> str:
    """The whole report as one HTML document."""
    p = data.profile
    pbadge = _badge((p or {}).get("device"))
    served_devices = {e.get("device") for e in data.events if e["kind"] == "add"} | {a.get("device") for a in data.accepted}
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>kernelloop report</title>", f"<style>{CSS}</style></head><body>",
        "<h1>kernelloop report</h1>",
        f'<p class="meta">history: {_e(data.source) or "none"} &middot; generated {_e(data.generated_at)}</p>',
        f"<h2>Latest profile{pbadge}</h2>", _profile_summary(p) if p else NO_DATA,
        _figure("Op time shares", lambda: charts.time_shares(p), "share of time per op", pbadge),
        _figure("Kernels over time: served by the registry, accepted by the sandbox",
                lambda: charts.served_over_time(data.events, data.accepted),
                "speedup of the kernel the registry served per op over time, and of each sandbox-accepted kernel",
                _badge(INTERPRETER if INTERPRETER in served_devices else None),
                "Steps: what the registry served per op, dtype and bucket (add: up, rollback: back to what it "
                "replaced), as speedup over the op's own kernel, compounded over the kernels it replaced. Hollow "
                "points: candidates the sandbox accepted, committed or not."),
        _figure("Percent of roofline per op", lambda: charts.roofline(p), "percent of roofline per op", pbadge),
        _figure("Attempts and rejection reasons per op",
                lambda: charts.attempts_by_op(data.accepted_counts, data.rejections), "verdicts per op by outcome"),
        "<h2>End-to-end gate results</h2>", _gates_table(data.events), audit_section(data.audit, data.events),
        quantize_section(data.events),
        f"<h2>Registry events (last {EVENT_ROWS})</h2>", _events_table(data.events),
        f"<h2>Tune runs (last {RUN_ROWS})</h2>", _runs_table(data.runs),
        f"<h2>Latest profile rows{pbadge}</h2>", _profile_table(p),
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

"""The report's figures: matplotlib (Agg canvas, no pyplot state) rendered to PNG bytes.

Each function returns None when it has nothing to draw, so the report can say "no data yet".
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

from matplotlib import colormaps
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

ACCEPTED_COLOR = "#2e7d32"
# failure colours: tab20 without its greens, so "accepted" stays the only green
FAILURE_COLORS = [c for i, c in enumerate(colormaps["tab20"].colors) if i not in (4, 5)]


def _figure(rows: int) -> Figure:
    fig = Figure(figsize=(8.0, max(2.2, 0.9 + 0.32 * rows)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _hbar(title: str, xlabel: str, labels: Sequence[str], values: Sequence[float], fmt: str) -> bytes:
    fig = _figure(len(labels))
    ax = fig.add_subplot()
    bars = ax.barh(range(len(labels)), values, color="#3b6ea5")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.bar_label(bars, labels=[fmt.format(v) for v in values], padding=3, fontsize=8)
    ax.set_xlim(0, max(max(values), 1e-9) * 1.18)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    return _png(fig)


def time_shares(profile: Mapping[str, Any] | None) -> bytes | None:
    """Horizontal bars: each row's share of the profiled time (latest profile)."""
    rows = [r for r in (profile or {}).get("rows", []) if r.get("share") is not None]
    if not rows:
        return None
    rows.sort(key=lambda r: r["share"], reverse=True)
    labels = [r["name"] if r.get("kind") != "other" else f"{r['name']} (not a library op)" for r in rows]
    return _hbar("Share of time per op (latest profile)", "% of profiled time", labels,
                 [100.0 * r["share"] for r in rows], "{:.1f}%")


def roofline(profile: Mapping[str, Any] | None) -> bytes | None:
    """Horizontal bars: achieved percent of the roofline (copy bandwidth) per op (latest profile)."""
    rows = [r for r in (profile or {}).get("rows", []) if r.get("roofline_pct") is not None and r.get("kind") != "other"]
    if not rows:
        return None
    rows.sort(key=lambda r: r["roofline_pct"], reverse=True)
    return _hbar("Percent of roofline per op (latest profile)", "% of the memory-bandwidth roofline",
                 [r["name"] for r in rows], [r["roofline_pct"] for r in rows], "{:.1f}%")


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def speedups_over_time(accepted: Sequence[Mapping[str, Any]]) -> bytes | None:
    """Per op: each accepted kernel's speedup (with its interval) at the time it was accepted."""
    points = [a for a in accepted if a.get("speedup") is not None and a.get("created_at")]
    if not points:
        return None
    ops = sorted({a["op"] or "?" for a in points})
    fig = _figure(8)
    ax = fig.add_subplot()
    for op in ops:
        mine = [a for a in points if (a["op"] or "?") == op]
        xs = [_when(a["created_at"]) for a in mine]
        ys = [a["speedup"] for a in mine]
        lo = [max(0.0, y - (a["speedup_lo"] if a.get("speedup_lo") is not None else y)) for y, a in zip(ys, mine)]
        hi = [max(0.0, (a["speedup_hi"] if a.get("speedup_hi") is not None else y) - y) for y, a in zip(ys, mine)]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=op)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    times = [_when(a["created_at"]) for a in points]
    span = max(max(times) - min(times), timedelta(hours=1))  # one point: an hour's window, not decades
    ax.set_xlim(min(times) - span * 0.1, max(times) + span * 0.1)
    ax.set_title("Speedup of each accepted kernel over time")
    ax.set_ylabel("speedup over what it replaced (x)")
    ax.set_xlabel("accepted at (UTC)")
    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    ax.legend(fontsize=8)
    return _png(fig)


def attempts_by_op(accepted_counts: Mapping[str, int], rejections: Mapping[str, Mapping[str, int]]) -> bytes | None:
    """Stacked bars per op: accepted verdicts, then rejected ones by failure code."""
    ops = sorted(set(accepted_counts) | set(rejections))
    if not ops:
        return None
    failures = sorted({f for counts in rejections.values() for f in counts})
    fig = _figure(max(len(ops), len(failures) + 1))
    ax = fig.add_subplot()
    left = [0] * len(ops)
    series = [("accepted", [accepted_counts.get(op, 0) for op in ops])]
    series += [(f, [rejections.get(op, {}).get(f, 0) for op in ops]) for f in failures]
    for i, (label, counts) in enumerate(series):
        color = ACCEPTED_COLOR if label == "accepted" else FAILURE_COLORS[(i - 1) % len(FAILURE_COLORS)]
        ax.barh(range(len(ops)), counts, left=left, label=label, color=color)
        left = [a + b for a, b in zip(left, counts)]
    ax.set_yticks(range(len(ops)), ops)
    ax.invert_yaxis()
    ax.set_title("Verdicts per op: accepted and rejection reasons")
    ax.set_xlabel("verdicts")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)

"""The report's figures: matplotlib (Agg canvas, no pyplot state) rendered to PNG bytes.

Each function returns None when it has nothing to draw, so the report can say "no data yet".
Figures measured on the Triton CPU interpreter carry a subtitle saying so.
"""

from __future__ import annotations

import io
import math
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from kernelloop.kernels.device import CPU_INTERPRETER as INTERPRETER

INTERPRETER_NOTE = "measured on cpu-interpreter (Triton's CPU interpreter): not GPU figures"
ACCEPTED_COLOR = "#2e7d32"
# failure colours: tab20 without its greens, so "accepted" stays the only green
FAILURE_COLORS = [c for i, c in enumerate(colormaps["tab20"].colors) if i not in (4, 5)]
OP_COLORS = colormaps["tab10"].colors
ServedKey = tuple[str, str, str, str]  # op, device, dtype, bucket: one registry slot


def format_pct(value: float, digits: int = 2) -> str:
    """A percentage with `digits` significant digits however small (0.00042%, 12.5%, 40.0%)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}%"
    decimals = min(12, max(1, digits - 1 - math.floor(math.log10(abs(value)))))
    return f"{value:.{decimals}f}%"


def _figure(rows: int) -> Figure:
    fig = Figure(figsize=(8.0, max(2.2, 0.9 + 0.32 * rows)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _title(fig: Figure, ax: Any, title: str, interpreter: bool) -> None:
    ax.set_title(title)
    if interpreter:
        fig.suptitle(INTERPRETER_NOTE, color="#a15c00", fontsize=9, fontweight="bold")


def _hbar(title: str, xlabel: str, labels: Sequence[str], values: Sequence[float], interpreter: bool) -> bytes:
    """Bars of percentages (0-100 scale), each labelled with significant digits."""
    fig = _figure(len(labels) + (1 if interpreter else 0))
    ax = fig.add_subplot()
    bars = ax.barh(range(len(labels)), values, color="#3b6ea5")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.bar_label(bars, labels=[format_pct(v) for v in values], padding=3, fontsize=8)
    ax.set_xlim(0, max(max(values), 1e-12) * 1.22)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_pct(v)))
    _title(fig, ax, title, interpreter)
    ax.set_xlabel(xlabel)
    return _png(fig)


def _interpreted(profile: Mapping[str, Any] | None) -> bool:
    return (profile or {}).get("device") == INTERPRETER


def time_shares(profile: Mapping[str, Any] | None) -> bytes | None:
    """Horizontal bars: each row's share of the profiled time (latest profile)."""
    rows = [r for r in (profile or {}).get("rows", []) if r.get("share") is not None]
    if not rows:
        return None
    rows.sort(key=lambda r: r["share"], reverse=True)
    labels = [r["name"] if r.get("kind") != "other" else f"{r['name']} (not a library op)" for r in rows]
    return _hbar("Share of time per op (latest profile)", "% of profiled time", labels,
                 [100.0 * r["share"] for r in rows], _interpreted(profile))


def roofline(profile: Mapping[str, Any] | None) -> bytes | None:
    """Horizontal bars: achieved percent of the roofline per op (latest profile). `roofline_pct` is
    already a percentage (100 x least possible time / measured time, profiler/analysis.py)."""
    rows = [r for r in (profile or {}).get("rows", []) if r.get("roofline_pct") is not None and r.get("kind") != "other"]
    if not rows:
        return None
    rows.sort(key=lambda r: r["roofline_pct"], reverse=True)
    return _hbar("Percent of roofline per op (latest profile)", "% of the roofline (least possible time / time taken)",
                 [r["name"] for r in rows], [r["roofline_pct"] for r in rows], _interpreted(profile))


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def served_series(events: Sequence[Mapping[str, Any]]
                  ) -> tuple[dict[ServedKey, list[tuple[str, float, str]]], dict[str, float]]:
    """What the registry served per slot, replayed from its add and rollback events (oldest first):
    {slot: [(time, speedup over the op's own kernel, event kind)]}, and that speedup per entry id.

    Each entry was timed against the one it replaced, so its speedup over the op's own kernel is
    its own times its predecessor's; a rollback brings the predecessor back (or the op's kernel, 1.0)."""
    stacks: dict[ServedKey, list[str]] = {}
    slot_of: dict[str, ServedKey] = {}
    value_of: dict[str, float] = {}
    series: dict[ServedKey, list[tuple[str, float, str]]] = {}
    for e in events:
        entry = e.get("entry_id")
        if e.get("kind") == "add" and entry and e.get("speedup") is not None:
            slot = (e.get("op") or "?", e.get("device") or "?", e.get("dtype") or "?", e.get("bucket") or "?")
            stack = [s for s in stacks.get(slot, []) if s != entry]
            value_of[entry] = (value_of[stack[-1]] if stack else 1.0) * e["speedup"]
            slot_of[entry], stacks[slot] = slot, stack + [entry]
        elif e.get("kind") == "rollback" and entry in slot_of and entry in stacks[slot_of[entry]]:
            slot = slot_of[entry]
            stacks[slot].remove(entry)
        else:
            continue
        top = stacks[slot]
        series.setdefault(slot, []).append((e["created_at"], value_of[top[-1]] if top else 1.0, e["kind"]))
    return series, value_of


def _accepted_value(a: Mapping[str, Any], value_of: Mapping[str, float]) -> float:
    """An accepted verdict's speedup over the op's own kernel (it was timed against `baseline`)."""
    baseline = a.get("baseline") or ""
    return a["speedup"] * (value_of.get(baseline[len("registry "):], 1.0) if baseline.startswith("registry ") else 1.0)


def served_over_time(events: Sequence[Mapping[str, Any]], accepted: Sequence[Mapping[str, Any]]) -> bytes | None:
    """Per registry slot, a step line of what was served (committed and kept: adds, rollbacks);
    hollow points: kernels the sandbox accepted, committed or not. Both as speedup over the op's own kernel."""
    series, value_of = served_series(events)
    points = [a for a in accepted if a.get("speedup") is not None and a.get("created_at")]
    if not series and not points:
        return None
    ops = sorted({slot[0] for slot in series} | {a.get("op") or "?" for a in points})
    color = {op: OP_COLORS[i % len(OP_COLORS)] for i, op in enumerate(ops)}
    times = [_when(t) for steps in series.values() for t, _, _ in steps] + [_when(a["created_at"]) for a in points]
    span = max(max(times) - min(times), timedelta(hours=1))  # one point: an hour's window, not decades
    right = max(times) + span * 0.1
    fig = _figure(10)
    ax = fig.add_subplot()
    for (op, _device, dtype, bucket), steps in sorted(series.items()):
        xs, ys = [_when(t) for t, _, _ in steps], [v for _, v, _ in steps]
        ax.step(xs + [right], ys + ys[-1:], where="post", color=color[op], linewidth=2,
                label=f"{op} {dtype} [{bucket}]: served")
        for x, y, (_, _, kind) in zip(xs, ys, steps):
            ax.plot(x, y, marker="o" if kind == "add" else "v", color=color[op], markersize=6)
    for op in ops:
        mine = [a for a in points if (a.get("op") or "?") == op]
        if not mine:
            continue
        ys = [_accepted_value(a, value_of) for a in mine]
        lo = [max(0.0, y * (1 - a["speedup_lo"] / a["speedup"])) if a.get("speedup_lo") else 0.0 for y, a in zip(ys, mine)]
        hi = [max(0.0, y * (a["speedup_hi"] / a["speedup"] - 1)) if a.get("speedup_hi") else 0.0 for y, a in zip(ys, mine)]
        ax.errorbar([_when(a["created_at"]) for a in mine], ys, yerr=[lo, hi], fmt="o", mfc="none", capsize=3,
                    color=color[op], alpha=0.8, label=f"{op}: accepted by the sandbox")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlim(min(times) - span * 0.1, right)
    interpreter = any(slot[1] == INTERPRETER for slot in series) or any(a.get("device") == INTERPRETER for a in points)
    _title(fig, ax, "Served by the registry (steps; ▼ rollback), accepted by the sandbox (hollow)", interpreter)
    ax.set_ylabel("speedup over the op's own kernel (x)")
    ax.set_xlabel("time (UTC)")
    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
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

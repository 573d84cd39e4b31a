"""The report's quantization section: the latest `agent quantize` run (its "quantize" registry event, and the
"gate" and "rollback" events naming the same commit). Absent (an empty string) until a run was recorded."""

from __future__ import annotations

import base64
import html
import math
from typing import Any, Mapping, Sequence

from kernelloop.history.charts import INTERPRETER, OP_COLORS, _figure, _png, _title
from kernelloop.kernels.device import Fingerprint


def sensitivity_chart(sens: Sequence[Mapping[str, Any]], plan: Mapping[str, str]) -> bytes | None:
    """KL per projection (forward order) per scheme, log scale; the chosen (scope, scheme) ringed."""
    scopes = list(dict.fromkeys(s["scope"] for s in sens))
    if not scopes:
        return None
    fig = _figure(14)  # height for the rotated scope names
    ax = fig.add_subplot()
    floor = min((s["kl"] for s in sens if s["kl"] > 0), default=1e-12) / 2
    for i, name in enumerate(dict.fromkeys(s["scheme"] for s in sens)):
        rows = [s for s in sens if s["scheme"] == name]
        xs = [scopes.index(s["scope"]) for s in rows]
        ax.plot(xs, [max(s["kl"], floor) for s in rows], "o-", color=OP_COLORS[i % len(OP_COLORS)], label=name,
                markersize=4, linewidth=1)
        picked = [(x, max(s["kl"], floor)) for x, s in zip(xs, rows) if plan.get(s["scope"]) == name]
        if picked:
            ax.scatter(*zip(*picked), s=90, facecolors="none", edgecolors="black", linewidths=1.4, zorder=3,
                       label="chosen" if i == 0 else None)
    ax.set_yscale("log")
    if len(scopes) <= 40:
        ax.set_xticks(range(len(scopes)), scopes, rotation=90, fontsize=6)
    else:  # a real model: one tick per layer's first projection, every other layer
        ticks = [(i, s.split(".")[1] if s.startswith("layers.") else s) for i, s in enumerate(scopes)
                 if s == "lm_head" or (s.endswith("qkv_proj") and int(s.split(".")[1]) % 2 == 0)]
        ax.set_xticks([i for i, _ in ticks], [t for _, t in ticks], fontsize=7)
        ax.set_xlabel("layer (qkv, o, gate_up, down per layer), then lm_head")
    ax.set_ylabel("KL alone (nats / token)")
    ax.legend(fontsize=8)
    _title(fig, ax, "Sensitivity per projection", False)  # no timings: KL is the same on any device
    return _png(fig)


def _fmt(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def _num(value: Any, fmt: str) -> str:
    return f'<td class="num">{_fmt(value, fmt)}</td>'


def _mib(n: Any) -> str:
    return _num(n / 2**20 if isinstance(n, (int, float)) else None, ".2f")


def quantize_section(events: Sequence[Mapping[str, Any]]) -> str:
    """HTML for the latest quantize run in `events` (registry events, oldest first); '' when there is none."""
    runs = [e for e in events if e.get("kind") == "quantize" and isinstance(e.get("detail"), dict)]
    if not runs:
        return ""
    run = runs[-1]
    d, sha = run["detail"], run.get("commit_sha")
    plan = (d.get("selection") or {}).get("plan") or {}
    chosen = (d.get("selection") or {}).get("chosen") or []
    out = ["<h2>Quantization</h2>",
           f'<p class="meta">latest agent quantize: {html.escape(str(d.get("model")))} on {html.escape(str(d.get("device")))}'
           f' ({html.escape(str(d.get("dtype")))}), schemes {html.escape(", ".join(d.get("schemes") or []))}, KL budget '
           f'{d.get("budget")} nats, {html.escape(str(run.get("created_at", ""))[:19])}'
           + ("" if sha else f'; {html.escape(str(d.get("status")))}: {html.escape(str(d.get("reason", "")))}') + "</p>"]
    png = sensitivity_chart(d.get("sensitivities") or [], plan)
    if png:
        out.append(f'<img alt="KL per projection per scheme, log scale, chosen ones ringed" '
                   f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    b = d.get("bytes") or {}
    share = b.get("saved", 0) / b["projections"] if b.get("projections") else None
    out.append(f"<p>bytes saved: {b.get('saved', 0) / 2**20:.2f} MiB of {b.get('projections', 0) / 2**20:.2f} MiB of "
               f"projection weights" + (f" ({share:.1%})" if share is not None else "") + "</p>")
    out.append("<table><tr><th>prompts</th><th>count</th><th>KL (nats / token)</th><th>greedy agreement</th></tr>")
    for label in ("calibration", "validation", "held_out"):
        q = d.get(label)
        if q is None:  # a run from before the validation split
            continue
        out.append(f"<tr><td>{label.replace('_', '-')}</td>{_num(q.get('prompts'), 'd')}{_num(q.get('kl'), '.2e')}"
                   f"{_num(q.get('agreement'), '.1%')}</tr>")
    out.append("</table><h3>Chosen projections</h3>")
    out.append("<table><tr><th>scope</th><th>scheme</th><th>solo KL</th><th>MiB saved</th></tr>" + "".join(
        f"<tr><td>{html.escape(s['scope'])}</td><td>{html.escape(s['scheme'])}</td>{_num(s.get('kl'), '.2e')}"
        f"{_mib(s.get('saved'))}</tr>" for s in chosen) + "</table>")
    alts = d.get("alternatives") or []
    if alts:
        out.append("<h3>Alternatives (held-out prompts)</h3><table><tr><th>selection</th><th>projections</th>"
                   "<th>MiB saved</th><th>KL</th><th>greedy agreement</th></tr>" + "".join(
                       f"<tr><td>{html.escape(str(a.get('name')))}</td>{_num(a.get('plan_size'), 'd')}"
                       f"{_mib(a.get('bytes_saved'))}{_num(a.get('kl'), '.2e')}{_num(a.get('agreement'), '.1%')}</tr>"
                       for a in alts) + "</table>")
    out.append(_gate(events, sha, str(d.get("device"))))
    return "\n".join(out)


def _gate(events: Sequence[Mapping[str, Any]], sha: str | None, device: Fingerprint) -> str:
    if not sha:
        return '<p class="meta">not committed (no gate)</p>'
    gates = [e for e in events if e.get("kind") == "gate" and e.get("commit_sha") == sha]
    if not gates:
        return f'<p class="meta">commit {html.escape(sha[:10])}: gate not recorded</p>'
    g = gates[-1].get("detail") or {}
    rolled = any(e.get("kind") == "rollback" and e.get("commit_sha") == sha for e in events)
    verdict = '<span class="bad">FAILED, rolled back</span>' if rolled or not gates[-1].get("ok") else '<span class="ok">passed</span>'
    label = " (cpu-interpreter timings: reported, not judged)" if device == INTERPRETER else ""
    ratio = g.get("tps_ratio")
    return (f"<p>gate for commit {html.escape(sha[:10])}: {verdict}: {html.escape(str(g.get('reason', '')))}</p>"
            f"<p class=\"meta\">KL after {g.get('kl_after', float('nan')):.2e} nats (budget {g.get('kl_budget')}), greedy "
            f"agreement {_fmt(g.get('forced_agreement'), '.1%')} teacher-forced, {_fmt(g.get('agreement'), '.1%')} "
            f"free-running, tokens/s "
            f"after/before {'-' if ratio is None else format(ratio, '.2f')}x{label}</p>")

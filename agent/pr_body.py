"""The text of `agent pr`: the branch name, the title and the PR body (benchmark table, provenance,
how to roll back). Every field taken from the registry is display-safe (kernels/display.py): no
control or bidi character reaches the PR."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from kernelloop.agent.pr_github import one_line
from kernelloop.kernels.display import safe_text
from kernelloop.kernels.registry.entry import Entry
from kernelloop.kernels.registry.manifest import MANIFEST_NAME

if TYPE_CHECKING:
    from kernelloop.agent.pr import Snapshot

EXPORT_DIR = "kernelloop/registry"


def branch_name(entries: list[Entry], now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"kernelloop/{stamp}-{entries[0].id}"


def title_for(entries: list[Entry]) -> str:
    ops = sorted({e.op for e in entries})
    n = len(entries)
    return safe_text(f"kernelloop: {n} kernel{'' if n == 1 else 's'} for {', '.join(ops)}")


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "—"
    return safe_text(one_line(value)).replace("|", "\\|")


def _seconds(value: Any) -> str:
    if value is None:
        return "—"
    s = float(value)
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.3f} ms"
    return f"{s:.3f} s"


def _fraction(value: Any) -> str:
    return "—" if value is None else f"{100 * float(value):.1f}%"


def speedup_text(e: Entry) -> str:
    return f"{e.speedup:.3f}x [{e.speedup_ci[0]:.3f}, {e.speedup_ci[1]:.3f}]"


def render_body(new: list[Entry], snapshot: Snapshot, timings: dict[str, dict[str, Any] | None]) -> str:
    n_new, n_all = len(new), len(snapshot.entries)
    where = f" at registry commit `{snapshot.commit}`" if snapshot.commit else ""
    lines = [
        f"kernelloop proposes {n_new} verified kernel{'' if n_new == 1 else 's'} new since its last proposal.",
        "",
        f"The registry is exported under `{EXPORT_DIR}/`: `{MANIFEST_NAME}` and `kernels/<op>/<sha256>.py`, "
        f"byte-identical copies of the registry's files{where}, so this diff is exactly the new or changed kernels.",
    ]
    if n_all > n_new:
        old = n_all - n_new
        lines.append(f"The manifest holds {n_all} entries in all; {old} of them "
                     f"{'was' if old == 1 else 'were'} proposed before and {'is' if old == 1 else 'are'} not listed here.")
    lines += [
        "",
        "### Benchmarks",
        "",
        "Speedup: median over the kernel the engine ran before, with its distribution-free 95% interval. Times are the "
        "latest sandbox verdict's medians per call; roofline is the fraction of the device's copy bandwidth reached.",
        "",
        "| entry | op | device | dtype | bucket | speedup [95% interval] | baseline | candidate | roofline "
        "| proposer | model | history id | verified at |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in new:
        t = timings.get(e.id) or {}
        p = e.provenance
        lines.append("| " + " | ".join([
            f"`{e.id}`", _cell(e.op), _cell(e.device), _cell(e.dtype), f"`{_cell(e.bucket)}`", speedup_text(e),
            _seconds(t.get("baseline_s")), _seconds(t.get("candidate_s")), _fraction(t.get("roofline_fraction")),
            _cell(p.proposer), _cell(p.model), _cell(p.history_id), _cell(e.verified_at),
        ]) + " |")
    lines += ["", "### Provenance", ""]
    for e in new:
        p, t = e.provenance, timings.get(e.id)
        measured = ""
        if t and t.get("shape") is not None:
            measured = f"; timed at shape `{json.dumps(t['shape'], sort_keys=True)}` {_cell(t.get('dtype'))}"
        lines.append(
            f"- `{e.id}`: proposed by {_cell(p.proposer)} (model {_cell(p.model)}, prompt hash {_cell(p.prompt_hash)}), "
            f"history candidate {_cell(p.history_id)}; source `{EXPORT_DIR}/{e.source_path}` "
            f"(sha256 `{e.sha256}`); verified {_cell(e.verified_at)}, added {_cell(e.added_at)}{measured}."
        )
    lines += [
        "",
        "### How to roll back",
        "",
        "Withdraw a kernel from the registry (a revert commit there; dispatch then serves what it served before):",
        "",
        "```",
        *[f"agent registry rollback {e.id}" for e in new],
        "```",
        "",
        "Undo this pull request here by reverting it (`git revert <its commit>`, or `git revert -m 1 <merge commit>` "
        "for a merge commit); the registry itself is changed only by `agent registry rollback`.",
        "",
    ]
    return safe_text("\n".join(lines), multiline=True)

"""Which op to tune, and at which shapes: read off the engine profile.

Score = share of engine time x headroom to the roofline (1 - roofline fraction); an op whose tune
runs in the last day all ended without a winner counts a quarter. `agent tune <op>` skips the choice
but still takes the op's shapes from the profile.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from kernelloop.common.errors import KernelloopError

RECENT = timedelta(hours=24)
RECENT_FAILURE_WEIGHT = 0.25


def op_rows(profile: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in profile.get("rows", []) if r.get("kind") == "op"}


def choose_target(profile: dict[str, Any], history: Any) -> tuple[str, str]:
    """(op, why) with the highest score; raises when the profile saw no op."""
    rows = op_rows(profile)
    if not rows:
        raise KernelloopError("the profile saw no op of the library; nothing to tune")
    since = (datetime.now(timezone.utc) - RECENT).replace(microsecond=0).isoformat()
    scored = []
    for name, row in rows.items():
        headroom = 1.0 - min((row.get("roofline_pct") or 0.0) / 100.0, 1.0)
        score = row["share"] * headroom
        runs = history.recent_runs("tune", name, since)
        if runs and all(r["status"] in ("no-winner", "gate-failed", "no-candidate") for r in runs):
            score *= RECENT_FAILURE_WEIGHT
        scored.append((score, name, row))
    score, name, row = max(scored)
    return name, f"{name}: {100 * row['share']:.1f}% of step time, {row.get('roofline_pct') or 0:.2f}% of roofline (score {score:.3f})"


def op_shapes(profile: dict[str, Any], op: str) -> tuple[str, list[dict[str, int]], dict[str, Any]]:
    """(dtype, shapes hottest first, roofline figures) of `op` in the profile."""
    row = op_rows(profile).get(op)
    if row is None or not row.get("shapes"):
        raise KernelloopError(f"the profile never saw {op}: the engine does not call it with this model")
    buckets = sorted(row["shapes"], key=lambda s: -s["seconds"])
    dtype = buckets[0]["dtype"]
    shapes = [dict(s["shape"]) for s in buckets if s["dtype"] == dtype]
    return dtype, shapes, {"bytes_per_s": row.get("bytes_per_s"), "roofline_pct": row.get("roofline_pct")}

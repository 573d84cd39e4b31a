"""One profile for a fleet of engines: `merge_profiles` folds each engine's profile into one that
satisfies the same contract (kernelloop/common/profile_contract.py), so the target is chosen over the fleet.

Each engine's seconds are counted per generated token of its profile and then weighted by the tokens
that engine serves (`served_tokens`; default: the tokens it generated while profiled), so an op's
merged share is the share of the fleet's step time it would take on that traffic: a busy engine's
hottest op outweighs an idle engine's. With weights proportional to each profile's own tokens the
merge is a plain sum of seconds. A pure function: no I/O, the inputs are not changed.
"""

from __future__ import annotations

from typing import Sequence

from kernelloop.common.errors import KernelloopError
from kernelloop.common.profile_contract import Profile, ProfileRow, ShapeSeen


def merge_profiles(profiles: Sequence[Profile], served_tokens: Sequence[float] | None = None) -> Profile:
    """The fleet's profile: rows merged by name (seconds and calls scaled by each engine's weight),
    shares adding up to 1, shapes merged by dtype and bucket, and `engines` listing each engine's URL,
    served tokens and weight. Raises KernelloopError for no profiles or profiles of different devices."""
    if not profiles:
        raise KernelloopError("no engine profiles to merge")
    devices = sorted({p["device"] for p in profiles})
    if len(devices) > 1:
        raise KernelloopError(f"the fleet's engines run on different devices ({', '.join(devices)}); "
                              "one tune run serves one device")
    tokens = [float(t) for t in (served_tokens if served_tokens is not None else [p["output_tokens"] for p in profiles])]
    if len(tokens) != len(profiles) or any(t < 0 for t in tokens):
        raise KernelloopError("served_tokens: one count of at least 0 per profile")
    weights = [t / sum(tokens) for t in tokens] if sum(tokens) > 0 else [1 / len(profiles)] * len(profiles)
    generated = sum(p["output_tokens"] for p in profiles)
    # Seconds per generated token x the engine's share of the fleet's tokens x the tokens profiled.
    scales = [_scale(w, p["output_tokens"], generated, len(profiles)) for w, p in zip(weights, profiles)]
    rows = _merge_rows(profiles, scales)
    busy = sum(r["total_s"] for r in rows)
    for r in rows:
        r["share"] = r["total_s"] / busy if busy > 0 else 0.0
    notes = [f"fleet of {len(profiles)} engines, rows weighted by served tokens: "
             + ", ".join(f"{p['engine']} {w:.3f} ({t:g} tokens)" for p, w, t in zip(profiles, weights, tokens))]
    notes += [f"{p['engine']} generated no token while profiled: its rows are left out"
              for p, s, w in zip(profiles, scales, weights) if s == 0 and w > 0]
    notes += [f"{p['engine']}: {n}" for p in profiles for n in p["notes"]]
    return {
        "created_at": max(p["created_at"] for p in profiles),
        "device": devices[0],
        "engine": "fleet: " + ", ".join(p["engine"] for p in profiles),
        "model": _joined([p["model"] for p in profiles], ", "),
        "kernels": _joined([p["kernels"] for p in profiles], "+"),
        "timing_label": profiles[0]["timing_label"],
        "op_timing": _joined([p["op_timing"] for p in profiles if p["op_timing"]], "+") or None,
        "region_timing": _joined([p["region_timing"] for p in profiles if p["region_timing"]], "+") or None,
        "replay_errors": [f"{p['engine']}: {e}" for p in profiles for e in p["replay_errors"]],
        "partial": any(p["partial"] for p in profiles),
        "partial_reason": "; ".join(f"{p['engine']}: {p['partial_reason']}" for p in profiles if p["partial_reason"]),
        "wall_seconds": max(p["wall_seconds"] for p in profiles),  # the engines are profiled at the same time
        "busy_seconds": busy,
        "steps": sum(p["steps"] for p in profiles),
        "requests": sum(p["requests"] for p in profiles),
        "output_tokens": generated,
        "tokens_per_second": sum(p["tokens_per_second"] for p in profiles),  # the fleet's throughput
        "ttft_ms_median": _weighted([(p["ttft_ms_median"], w) for p, w in zip(profiles, weights)]),
        "tpot_ms_median": _weighted([(p["tpot_ms_median"], w) for p, w in zip(profiles, weights)]),
        "prefix_hit_rate": _weighted([(p["prefix_hit_rate"], w) for p, w in zip(profiles, weights)]),
        "notes": notes,
        "auto_stopped": any(p["auto_stopped"] for p in profiles),
        "cancelled_requests": sum(p["cancelled_requests"] for p in profiles),
        "rows": sorted(rows, key=lambda r: -r["total_s"]),
        "engines": [{"url": p["engine"], "served_tokens": t, "weight": w, "output_tokens": p["output_tokens"]}
                    for p, t, w in zip(profiles, tokens, weights)],
    }


def _scale(weight: float, output_tokens: int, generated: int, engines: int) -> float:
    """What an engine's seconds are multiplied by: per generated token, times its share of the fleet's."""
    if not generated:  # no engine generated a token: the seconds as they are, weighted
        return weight * engines
    return weight * generated / output_tokens if output_tokens else 0.0


def _merge_rows(profiles: Sequence[Profile], scales: list[float]) -> list[ProfileRow]:
    groups: dict[str, list[tuple[ProfileRow, float]]] = {}
    for profile, scale in zip(profiles, scales):
        for row in profile["rows"]:
            if scale > 0:
                groups.setdefault(row["name"], []).append((row, scale))
    return [_merge_row(group) for group in groups.values()]


def _merge_row(group: list[tuple[ProfileRow, float]]) -> ProfileRow:
    first = group[0][0]
    seconds = sum(r["total_s"] * s for r, s in group)
    calls = round(sum(r["calls"] * s for r, s in group))
    moved = [r["bytes_per_s"] * r["total_s"] * s for r, s in group if r["bytes_per_s"] is not None]
    least = [r["roofline_pct"] / 100 * r["total_s"] * s for r, s in group if r["roofline_pct"] is not None]
    bound = max(((r["bound"], r["total_s"] * s) for r, s in group if r["bound"]), key=lambda b: b[1], default=(None, 0))[0]
    variants = sorted({v.strip() for r, _ in group if r["variant"] for v in r["variant"].split(",")})
    row: ProfileRow = {
        "name": first["name"], "kind": first["kind"], "calls": calls, "total_s": seconds,
        "mean_us": 1e6 * seconds / calls if calls else 0.0, "share": 0.0,
        "timing": "+".join(sorted({t for r, _ in group for t in r["timing"].split("+")})),
        "variant": ", ".join(variants) or None,
        "bytes_per_s": sum(moved) / seconds if moved and seconds > 0 else None,
        "roofline_pct": 100 * sum(least) / seconds if least and seconds > 0 else None,
        "bound": bound, "shapes": _merge_shapes(group),
    }
    if any("in_run_s" in r for r, _ in group):
        row["in_run_s"] = sum(r.get("in_run_s", r["total_s"]) * s for r, s in group)
    return row


def _merge_shapes(group: list[tuple[ProfileRow, float]]) -> list[ShapeSeen]:
    merged: dict[tuple[str, str], ShapeSeen] = {}
    for row, scale in group:
        for shape in row["shapes"]:
            key = (shape["dtype"], shape["bucket"])
            seen = merged.get(key)
            if seen is None:
                merged[key] = {"dtype": shape["dtype"], "bucket": shape["bucket"], "shape": dict(shape["shape"]),
                               "calls": 0, "seconds": 0.0}
                seen = merged[key]
            elif sum(shape["shape"].values()) > sum(seen["shape"].values()):
                seen["shape"] = dict(shape["shape"])  # the largest shape seen in the bucket
            seen["calls"] += shape["calls"] * scale
            seen["seconds"] += shape["seconds"] * scale
    for seen in merged.values():
        seen["calls"] = round(seen["calls"])
    return sorted(merged.values(), key=lambda s: -s["seconds"])


def _joined(values: list[str], sep: str) -> str:
    """The one value all engines share, else the distinct values joined."""
    return sep.join(dict.fromkeys(values))


def _weighted(pairs: list[tuple[float | None, float]]) -> float | None:
    """The weighted mean of the values present; None when none is."""
    known = [(v, w) for v, w in pairs if v is not None]
    total = sum(w for _, w in known)
    if not known:
        return None
    return sum(v * w for v, w in known) / total if total > 0 else sum(v for v, _ in known) / len(known)

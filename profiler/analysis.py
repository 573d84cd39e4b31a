"""From a Recorder's raw seconds to the profile's op table: shares, shape buckets, roofline.

Rows (their shares add up to 100% of engine step time):
  one per op of the op library    every call, timed by the Dispatcher's observer: every projection
                                  (linear), both attentions (extend_attention, decode_attention),
                                  the norms, rope and silu_mul
  other model compute             the rest of the forward: embedding, KV writes, views, casts
  sampling                        logits -> tokens, logprobs
  scheduling                      batch selection and building the ForwardBatch
  python overhead                 the rest of the step: bookkeeping, detokenizing, queues

Every row says where its seconds come from (`timing`, see engine/recorder.py): op rows the op
timing (`cpu-wall` on CPU; on CUDA `cuda-kernel-replay`, device time, or `cuda-events` where no
replay ran), the other rows the region timing (`cpu-wall` or `cuda-events`). With device times for
ops, the host's launch gaps between op kernels land in "other model compute".
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch

from kernelloop.engine.recorder import FORWARD, SAMPLE, SCHEDULE, STEP, STEP_REGIONS
from kernelloop.kernels.ops import OPS
from kernelloop.kernels.roofline import Rates
from kernelloop.kernels.spec import parse_dtype

RatesFor = Callable[[torch.dtype], Rates]  # the device's roofline for calls in a dtype (kernels.roofline)


def _bucket_rows(op: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shapes seen, folded into the registry's buckets: [{dtype, bucket, shape (largest seen), calls, seconds}]."""
    spec = OPS[op]
    folded: dict[tuple[str, str], dict[str, Any]] = {}
    for c in calls:
        key = (c["dtype"], spec.bucket(c["shape"]))
        row = folded.setdefault(key, {"dtype": key[0], "bucket": key[1], "shape": c["shape"], "calls": 0, "seconds": 0.0})
        row["calls"] += c["calls"]
        row["seconds"] += c["seconds"]
        if sum(c["shape"].values()) > sum(row["shape"].values()):
            row["shape"] = c["shape"]
    return sorted(folded.values(), key=lambda r: -r["seconds"])


def region_timing(raw: dict[str, Any]) -> str:
    """How the step regions were timed (raw from an engine that does not say: from its device)."""
    return raw.get("region_timing") or ("cuda-events" if raw.get("device") == "cuda" else "cpu-wall")


def op_rows(raw: dict[str, Any], rates: RatesFor | None) -> list[dict[str, Any]]:
    """One row per op. roofline_pct: the least time the calls could take on the device (each call's
    max(bytes / copy bandwidth, FLOPs / matmul peak), kernels.roofline) over the time they took;
    bound: the side of the roofline most of that least time is on."""
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in raw.get("ops", []):
        if c["op"] in OPS:
            by_op[c["op"]].append(c)
    variants = raw.get("variants", {})
    rows = []
    for op, calls in by_op.items():
        spec = OPS[op]
        seconds = sum(c["seconds"] for c in calls)
        n = sum(c["calls"] for c in calls)
        costs = [(spec.cost(c["shape"], parse_dtype(c["dtype"])), parse_dtype(c["dtype"]), c["calls"]) for c in calls]
        moved = sum(cost.bytes * k for cost, _, k in costs)
        achieved = moved / seconds if seconds > 0 else None
        least = {"memory": 0.0, "compute": 0.0}
        for cost, dtype, k in costs if rates else ():
            r = rates(dtype)
            least[r.bound(cost)] += k * r.seconds(cost)
        floor = least["memory"] + least["compute"]
        timing = "+".join(sorted({c.get("timing") or region_timing(raw) for c in calls}))
        rows.append({
            "name": op, "kind": "op", "calls": n, "total_s": seconds, "mean_us": 1e6 * seconds / n if n else 0.0,
            "timing": timing, "in_run_s": sum(c.get("in_run_seconds", c["seconds"]) for c in calls),
            "variant": ", ".join(sorted(set(variants.get(op, {}).values()))) or None,
            "bytes_per_s": achieved,
            "roofline_pct": 100 * floor / seconds if floor and seconds > 0 else None,
            "bound": max(least, key=least.get) if floor else None,
            "shapes": _bucket_rows(op, calls),
        })
    return rows


def _other(name: str, seconds: float, calls: int, timing: str) -> dict[str, Any]:
    return {"name": name, "kind": "other", "calls": calls, "total_s": max(seconds, 0.0),
            "mean_us": 1e6 * max(seconds, 0.0) / calls if calls else 0.0, "timing": timing, "variant": None,
            "bytes_per_s": None, "roofline_pct": None, "bound": None, "shapes": []}


def profile_rows(raw: dict[str, Any], rates: RatesFor | None) -> list[dict[str, Any]]:
    """Every row with its share of step time, largest first."""
    regions = raw.get("regions", {})

    def secs(name: str) -> float:
        return regions.get(name, {}).get("seconds", 0.0)

    def calls(name: str) -> int:
        return regions.get(name, {}).get("calls", 0)

    rows = op_rows(raw, rates)
    ops_s = sum(r["total_s"] for r in rows)
    timing = region_timing(raw)
    rows += [
        _other("other model compute", secs(FORWARD) - ops_s, calls(FORWARD), timing),
        _other("sampling", secs(SAMPLE), calls(SAMPLE), timing),
        _other("scheduling", secs(SCHEDULE), calls(SCHEDULE), timing),
        _other("python overhead", secs(STEP) - sum(secs(name) for name in STEP_REGIONS), calls(STEP), timing),
    ]
    total = sum(r["total_s"] for r in rows)  # == step time up to clock noise (negative remainders clamp to 0)
    for r in rows:
        r["share"] = r["total_s"] / total if total > 0 else 0.0
    return sorted(rows, key=lambda r: -r["total_s"])

"""Re-judging the registry on this device: after a driver, Triton or torch upgrade, is every entry
still correct and still faster than the op's baseline kernel?

Each entry of this device is judged by the sandbox against the op's own baseline (not against the
registry, which would be itself), at a shape inside its bucket, in its dtype. An entry that is
wrong now, or whose speedup interval no longer clears 1.0, is a regression: reported, and with
`rollback=True` undone by a registry revert commit. Every result is a history event (kind "verify").
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from kernelloop.history import History
from kernelloop.kernels.device import device_fingerprint
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import ANY_BUCKET, Entry
from kernelloop.sandbox import CheckOptions, Sandbox


def bucket_shape(entry: Entry) -> dict[str, int] | None:
    """A concrete shape inside the entry's bucket (the top of a range); None for the any-shape bucket."""
    if entry.bucket == ANY_BUCKET:
        return None
    shape = {}
    for part in entry.bucket.split(","):
        key, value = part.split("=", 1)
        if value.startswith(">"):
            shape[key] = int(value[1:]) + 1
        else:
            shape[key] = int(value.split("-")[-1])
    return shape


def verify_registry(registry: Registry, history: History, device: str, *, rollback: bool = False,
                    timeout_s: float = 180.0, progress: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """One row per entry of this device: {entry, ok, verdict (JSON), rolled_back}."""
    fingerprint = device_fingerprint(device)
    entries = [e for e in registry.entries() if e.device == fingerprint]
    rows = []
    with tempfile.TemporaryDirectory() as empty:  # an empty registry: the baseline is the op's own kernel
        for entry in entries:
            get_op(entry.op)
            shape = bucket_shape(entry)
            # an entry serves only its own dtype, so that is the dtype re-checked
            options = CheckOptions(device=device, registry=Path(empty) / "none", dtypes=(entry.dtype,),
                                   timing_shape=shape, timing_dtype=entry.dtype, shapes=(shape,) if shape else (),
                                   min_gain=0.0, timeout_s=timeout_s)
            progress(f"verifying {entry.id} ({entry.op} {entry.dtype} [{entry.bucket}])")
            with Sandbox(options) as sandbox:
                verdict = sandbox.judge_source(entry.op, registry.source(entry), entry.id).to_json()
            ok = bool(verdict["accepted"])
            rolled_back = False
            if not ok and rollback:
                registry.rollback(entry.id)
                rolled_back = True
                history.record_registry_event("rollback", entry.op, entry_id=entry.id, device=fingerprint,
                                              dtype=entry.dtype, bucket=entry.bucket, ok=True,
                                              detail={"why": f"verify: {verdict['reason']}"})
            history.record_registry_event("verify", entry.op, entry_id=entry.id, device=fingerprint,
                                          dtype=entry.dtype, bucket=entry.bucket, speedup=verdict["speedup"], ok=ok,
                                          detail={"failure": verdict["failure"], "reason": verdict["reason"],
                                                  "speedup_interval": verdict["speedup_interval"],
                                                  "recorded_speedup": entry.speedup, "rolled_back": rolled_back})
            rows.append({"entry": entry, "ok": ok, "verdict": verdict, "rolled_back": rolled_back})
    return rows

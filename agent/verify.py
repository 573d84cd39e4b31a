"""Re-judging the registry on this device: after a driver, Triton or torch upgrade, is every entry
still correct and still faster than the op's baseline kernel?

Each entry of this device is judged by the sandbox against the op's own baseline (not against the
registry, which would be itself), at a shape inside its bucket, in its dtype. An entry that is
wrong now, or whose speedup interval no longer clears 1.0, is a regression: reported, and with
`rollback=True` undone by a registry revert commit. Every result is a history event (kind "verify").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kernelloop.history import History
from kernelloop.kernels.device import device_fingerprint
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import ANY_BUCKET, Entry
from kernelloop.kernels.spec import shape_in_bucket
from kernelloop.sandbox import CheckOptions, Sandbox, Verdict
from kernelloop.sandbox.verdict import judge_or_refuse


@dataclass(frozen=True)
class VerifyResult:
    """One registry entry of this device, re-judged against its op's baseline."""

    entry: Entry
    ok: bool               # still correct and faster than the baseline: the verdict was accepted
    verdict: Verdict       # the sandbox's verdict on the entry now
    rolled_back: bool      # it was not ok and `rollback=True` undid it with a registry revert commit

    @property
    def regressed(self) -> bool:
        """A regression left in place (reported, not rolled back)."""
        return not self.ok and not self.rolled_back

    def to_json(self) -> dict[str, Any]:
        """What `agent verify --json` prints for it: the entry's id, ok, rolled_back and the verdict's
        correct, speedup, speedup_interval, failure and reason."""
        v = self.verdict
        return {"entry": self.entry.id, "ok": self.ok, "rolled_back": self.rolled_back, "correct": v.correct,
                "speedup": v.speedup, "speedup_interval": v.speedup_interval, "failure": v.failure, "reason": v.reason}


def bucket_shape(entry: Entry) -> dict[str, int] | None:
    """A concrete shape inside the entry's bucket (the top of a range); None for the any-shape bucket."""
    return None if entry.bucket == ANY_BUCKET else shape_in_bucket(entry.bucket)


def verify_registry(registry: Registry, history: History, device: str, *, rollback: bool = False,
                    timeout_s: float | None = None, progress: Callable[[str], None] = lambda m: None) -> list[VerifyResult]:
    """One result per entry of this device, in the registry's order."""
    fingerprint = device_fingerprint(device)
    entries = [e for e in registry.entries() if e.device == fingerprint]
    results: list[VerifyResult] = []
    for entry in entries:  # the baseline is the op's own kernel, never the entry itself
        get_op(entry.op)
        shape = bucket_shape(entry)
        # an entry serves only its own dtype, so that is the dtype re-checked
        options = CheckOptions(device=device, registry_baseline=False, dtypes=(entry.dtype,),
                               timing_shape=shape, timing_dtype=entry.dtype, shapes=(shape,) if shape else (),
                               min_gain=0.0, timeout_s=timeout_s)
        progress(f"verifying {entry.id} ({entry.op} {entry.dtype} [{entry.bucket}])")
        with Sandbox(options) as sandbox:
            verdict = judge_or_refuse(sandbox, entry.op, registry.source(entry), entry.id)
        ok = bool(verdict.accepted)
        rolled_back = False
        if not ok and rollback:
            registry.rollback(entry.id)
            rolled_back = True
            history.record_registry_event("rollback", entry.op, entry_id=entry.id, device=fingerprint,
                                          dtype=entry.dtype, bucket=entry.bucket, ok=True,
                                          detail={"why": f"verify: {verdict.reason}"})
        history.record_registry_event("verify", entry.op, entry_id=entry.id, device=fingerprint,
                                      dtype=entry.dtype, bucket=entry.bucket, speedup=verdict.speedup, ok=ok,
                                      detail={"failure": verdict.failure, "reason": verdict.reason,
                                              "speedup_interval": verdict.speedup_interval,
                                              "recorded_speedup": entry.speedup, "rolled_back": rolled_back})
        results.append(VerifyResult(entry=entry, ok=ok, verdict=verdict, rolled_back=rolled_back))
    return results

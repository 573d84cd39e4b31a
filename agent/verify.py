"""Re-judging the registry on this device: after a driver, Triton or torch upgrade, is every entry
still correct and still faster than the op's baseline kernel?

Each entry of this device is judged by the sandbox against the op's own baseline (not against the
registry, which would be itself), at a shape inside its bucket, in its dtype. An entry that is
wrong now, or whose speedup interval no longer clears 1.0, is a regression: reported, and with
`rollback=True` undone by a registry revert commit. Every result is a history event (kind "verify").
With a cluster pool (`agent verify --cluster`), every entry is judged on every device kind the pool
has, one result per (entry, kind); only a failure on the entry's own kind is a regression.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from kernelloop.history import History
from kernelloop.kernels.device import Device, Fingerprint
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.registry import Registry
from kernelloop.kernels.registry.entry import ANY_BUCKET, Entry
from kernelloop.kernels.spec import shape_in_bucket
from kernelloop.sandbox import CheckOptions, Sandbox, Verdict
from kernelloop.sandbox.verdict import judge_or_refuse


@dataclass(frozen=True)
class VerifyResult:
    """One registry entry re-judged against its op's baseline on one device kind."""

    entry: Entry
    ok: bool               # still correct and faster than the baseline: the verdict was accepted
    verdict: Verdict       # the sandbox's verdict on the entry now
    rolled_back: bool      # it was not ok on its own device kind and `rollback=True` undid it (a revert commit)
    device: Fingerprint = ""  # the device kind it was judged on; "": the entry's own

    @property
    def own_kind(self) -> bool:
        """Judged on the device kind the entry serves (only there can it regress or be rolled back)."""
        return self.device in ("", self.entry.device)

    @property
    def regressed(self) -> bool:
        """A regression left in place (reported, not rolled back)."""
        return self.own_kind and not self.ok and not self.rolled_back

    def to_json(self) -> dict[str, Any]:
        """What `agent verify --json` prints for it: the entry's id, (--cluster) the device kind it was judged
        on, ok, rolled_back and the verdict's correct, speedup, speedup_interval, failure and reason."""
        v = self.verdict
        return {"entry": self.entry.id, **({"device": self.device} if self.device else {}), "ok": self.ok,
                "rolled_back": self.rolled_back, "correct": v.correct, "speedup": v.speedup,
                "speedup_interval": v.speedup_interval, "failure": v.failure, "reason": v.reason}


def bucket_shape(entry: Entry) -> dict[str, int] | None:
    """A concrete shape inside the entry's bucket (the top of a range); None for the any-shape bucket."""
    return None if entry.bucket == ANY_BUCKET else shape_in_bucket(entry.bucket)


def _options(entry: Entry, device: Device, timeout_s: float | None) -> CheckOptions:
    get_op(entry.op)
    shape = bucket_shape(entry)
    # the baseline is the op's own kernel, never the entry itself; an entry serves only its own dtype
    return CheckOptions(device=device, registry_baseline=False, dtypes=(entry.dtype,), timing_shape=shape,
                        timing_dtype=entry.dtype, shapes=(shape,) if shape else (), min_gain=0.0, timeout_s=timeout_s)


def _judge_here(registry: Registry, entries: list[Entry], device: Device, timeout_s: float | None,
                progress: Callable[[str], None]) -> list[tuple[Entry, str, Verdict]]:
    out = []
    for entry in entries:
        progress(f"verifying {entry.id} ({entry.op} {entry.dtype} [{entry.bucket}])")
        with Sandbox(_options(entry, device, timeout_s)) as sandbox:
            out.append((entry, "", judge_or_refuse(sandbox, entry.op, registry.source(entry), entry.id)))
    return out


def _judge_on_pool(registry: Registry, entries: list[Entry], device: Device, timeout_s: float | None,
                   progress: Callable[[str], None], pool: Any) -> list[tuple[Entry, str, Verdict]]:
    from kernelloop.sandbox.cluster import ClusterJob

    kinds = sorted(pool.device_kinds())
    pairs = [(entry, kind) for entry in entries for kind in kinds]
    progress(f"verifying {len(entries)} entries on {len(kinds)} device kinds ({', '.join(kinds)}): {len(pairs)} checks")
    jobs = [ClusterJob(op=entry.op, source=registry.source(entry), label=entry.id,
                       options=_options(entry, device, timeout_s), device_kind=kind) for entry, kind in pairs]
    verdicts = pool.judge(jobs, on_verdict=lambda i, v: progress(
        f"verified {pairs[i][0].id} on {pairs[i][1]}: {'ok' if v.accepted else v.failure or 'not faster'}"))
    return [(entry, kind, v) for (entry, kind), v in zip(pairs, verdicts)]


def verify_registry(registry: Registry, history: History, device: Device, *, rollback: bool = False,
                    timeout_s: float | None = None, progress: Callable[[str], None] = lambda m: None,
                    pool: Any = None) -> list[VerifyResult]:
    """One result per entry of this device, in the registry's order. With a cluster `pool`
    (sandbox/cluster JudgePool): every entry on every device kind the pool has, one result per pair;
    only a regression on the entry's own kind is rolled back."""
    fingerprint = device.fingerprint
    entries = [e for e in registry.entries() if pool is not None or e.device == fingerprint]
    judged = (_judge_on_pool(registry, entries, device, timeout_s, progress, pool) if pool is not None
              else _judge_here(registry, entries, device, timeout_s, progress))
    results: list[VerifyResult] = []
    for entry, kind, verdict in judged:
        ok = bool(verdict.accepted)
        result = VerifyResult(entry=entry, ok=ok, verdict=verdict, rolled_back=False, device=kind)
        if not ok and rollback and result.own_kind:
            registry.rollback(entry.id)
            result = replace(result, rolled_back=True)
            history.record_registry_event("rollback", entry.op, entry_id=entry.id, device=entry.device,
                                          dtype=entry.dtype, bucket=entry.bucket, ok=True,
                                          detail={"why": f"verify: {verdict.reason}"})
        history.record_registry_event("verify", entry.op, entry_id=entry.id, device=kind or fingerprint,
                                      dtype=entry.dtype, bucket=entry.bucket, speedup=verdict.speedup, ok=ok,
                                      detail={"failure": verdict.failure, "reason": verdict.reason,
                                              "speedup_interval": verdict.speedup_interval,
                                              "recorded_speedup": entry.speedup, "rolled_back": result.rolled_back,
                                              "entry_device": entry.device,
                                              "judged_by": verdict.judged_by})
        results.append(result)
    return results

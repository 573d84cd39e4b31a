"""The data a cluster judge works on and reports (no ray, no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from kernelloop.common.errors import KernelloopError
from kernelloop.kernels.device import Fingerprint
from kernelloop.sandbox.options import CheckOptions


class ClusterUnavailable(KernelloopError):
    """Ray is not installed, the cluster cannot be reached, or its judges cannot judge: one line, exit 2."""


@dataclass(frozen=True)
class ClusterJob:
    """One candidate to judge: data only (never a pickled candidate, function or module)."""

    op: str
    source: str
    label: str                       # file name / candidate label shown in the verdict
    options: CheckOptions
    device_kind: str | None = None   # judge only on an actor with this device fingerprint; None: any


@dataclass(frozen=True)
class ActorInfo:
    """One judge of the pool, as the head sees it."""

    index: int
    node: str        # node IP
    node_id: str
    pid: int
    device: Fingerprint
    busy: bool
    checks: int      # verdicts it returned
    failures: int    # of those, verdicts not correct
    replaced: int    # times the actor at this index died and was replaced

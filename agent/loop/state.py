"""The tune loop's state (checkpointed after every node) and its settings (the gate's are agent/gate_config.py).

Everything in `TuneState` is plain JSON, so langgraph's SQLite checkpointer can store it; live
objects (the engine, the sandbox, proposers) live in the LoopContext and are rebuilt on resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from kernelloop.kernels.device import CPU, Device
from kernelloop.sandbox.options import CheckOptions


@dataclass(frozen=True)
class TuneSettings:
    op: str | None                 # None: pick the target from the profile
    device: Device = CPU
    rounds: int = 3                # propose -> check rounds at most
    candidates: int = 4            # proposals per proposer per round
    min_gain: float = CheckOptions.min_gain
    sandbox_timeout_s: float | None = None  # seconds per candidate; None: the sandbox's default for the device
    profile_requests: int = 4
    batch_invariant: bool = False  # only winners whose verdict says batch_invariant (agent tune --batch-invariant)


class TuneState(TypedDict, total=False):
    run_id: int
    op: str
    status: str                    # running | winner | no-winner | no-candidate | gate-failed | failed
    reason: str
    profile_id: int | None
    dtype: str
    shapes: list[dict[str, int]]   # the op's shapes in the profile, hottest first
    bucket: str
    roofline: dict[str, Any]
    round: int
    pending: list[dict[str, Any]]  # proposals to judge: {candidate_id, source, proposer, label, ...}
    judged: list[dict[str, Any]]   # {candidate_id, label, proposer, sha256, verdict (trimmed)}, proposal verdicts too
    errors: dict[str, str]         # the latest round's proposer errors (the endpoint's last_error), by proposer
    winner: dict[str, Any] | None
    gate_before: dict[str, Any] | None
    committed: dict[str, Any] | None   # {entry_id, commit_sha}
    gate: dict[str, Any] | None

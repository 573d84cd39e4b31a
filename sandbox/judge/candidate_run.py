"""What the judge holds while it judges one candidate (sandbox/judge/orchestrator.py, and the timing phase
in sandbox/judge/timing.py, which works through it): the budget, the deadline every read and send of
the moment runs under, the phase a failure is reported in, and the sandboxed processes started for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelloop.sandbox.judge.budget import Budget
from kernelloop.sandbox.judge.children import Child


@dataclass
class CandidateRun:
    budget: Budget
    memory_mb: int        # the candidate's limit plus the harness's own share, per sandboxed process
    deadline: float       # time.monotonic() by which the current phase must be done
    phase: str = "starting"  # what the judge was doing, as a failure's reason names it
    children: list[Child] = field(default_factory=list)
    start_s: float = 0.0  # seconds spent starting sandboxed processes (the verdict's costs)

"""The tune loop's state (checkpointed after every node) and its settings (the loop's and the gate's).

Everything in `TuneState` is plain JSON, so langgraph's SQLite checkpointer can store it; live
objects (the engine, the sandbox, proposers) live in the LoopContext and are rebuilt on resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from kernelloop.sandbox.options import CheckOptions

GATE_PROMPTS = (
    "What is 3 plus 4?",
    "Once upon a time, a small robot",
    "List three colours.",
    "What is 12 minus 5?",
)


@dataclass(frozen=True)
class GateConfig:
    prompts: tuple[str, ...] = GATE_PROMPTS
    max_tokens: int = 6
    kl_margin: float = 1e-4      # nats per position
    tps_tolerance: float = 0.10  # a drop counts only when the whole after/before interval is below 1 - this
    speed_rounds: int = 3        # alternated before/after tokens/s measurements (one ratio per round)
    # Runaway check (agent/runaway.py): the first `runaway_prompts` prompts generated `runaway_tokens` long,
    # once per entry of `runaway_sampling` (None: greedy; an int: sampled from that seed), before and after.
    runaway_tokens: int = 256    # 0 turns the check off
    runaway_prompts: int = 3
    runaway_sampling: tuple[int | None, ...] = (None, 1234)
    runaway_repeats: int = 12    # back-to-back repeats of an n-gram that count as a loop
    # Batch invariance (agent/invariance.py): every prompt decoded `invariance_tokens` greedily alone, in a
    # batch of `invariance_batch` requests and with a prefix-cache hit, before and after.
    invariance_tokens: int = 16  # 0 turns the check off
    invariance_batch: int = 16
    # Task audit (agent/task_audit.py): a task suite (agent/task_suite.py: a bundled name such as "agent-v1"
    # or a JSONL path; "off" turns it off) answered greedily before and after; fails when the whole interval
    # of accuracy after/before is below 1 - task_tolerance. Off here (a real model's minutes per audit on the
    # CPU); `agent tune` turns agent-v1 on for cuda (agent/commands/common_args.py).
    tasks: str = "off"
    task_tolerance: float = 0.05
    # Budget mode (agent quantize): a commit that changes numerics on purpose. When set, greedy identity is not
    # required; the gate fails when KL after (to the float32 reference) exceeds this many nats per position, and
    # reports greedy agreement with before. None: the identity gate above.
    kl_budget: float | None = None


@dataclass(frozen=True)
class TuneSettings:
    op: str | None                 # None: pick the target from the profile
    device: str = "cpu"
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

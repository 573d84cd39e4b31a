"""The end-to-end gate's settings (agent/gate.py judges with them; each engine handle measures with them).

Light on purpose (no torch): the CLI's argument defaults and the engine handles import it.
"""

from __future__ import annotations

from dataclasses import dataclass

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

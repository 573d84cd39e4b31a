"""What the LLM is told about its previous answers: the sandbox's verdict (or a proposal verdict for an
answer that never reached the sandbox) as the next user turn, with a hint per failure code. What the
candidate wrote into the verdict (its reason, its output) is quoted display-safe (kernels/display.py)."""

from __future__ import annotations

import json
from typing import Any

from kernelloop.agent.proposers.prompts import gb_per_s
from kernelloop.history.queries import PROPOSAL_STAGE
from kernelloop.kernels.display import safe_text
from kernelloop.sandbox.verdict import CORRECT_FAILURES

MAX_LOG_CHARS = 600        # of a verdict's log_tail quoted back (load errors, tracebacks)

# Answers that never reached the sandbox get a verdict of their own (stage "proposal"), recorded in
# history and told back like the sandbox's. The sandbox's failure codes are sandbox.verdict.FAILURES.
# PROPOSAL_STAGE (from history.queries): the stage of a verdict for an answer never judged (no usable module, a repeat)
PROPOSAL_FAILURES = (
    "no-code",     # the answer holds no code block (prose, an empty answer, a tool call without source)
    "cut-off",     # max_tokens cut the answer (finish_reason "length") before a complete code block
    "truncated",   # the answer ended inside its code block: never closed, and the code does not parse
    "duplicate",   # the same module as an earlier candidate of this run: not judged again
)


def proposal_verdict(failure: str, reason: str, **extra: Any) -> dict:
    """The verdict record of an answer that never reached the sandbox (the shape of Verdict.to_json())."""
    assert failure in PROPOSAL_FAILURES, failure
    return {"correct": False, "accepted": False, "speedup": None, "speedup_interval": None, "failure": failure,
            "reason": reason, "stage": PROPOSAL_STAGE, "baseline": None, "timing": {}, "checks": [],
            "log_tail": "", "duration_s": 0.0, **extra}


HINTS = {
    "static": "Fix that line; the module is checked before it runs (imports, names, attributes, forward's signature).",
    "load": "The module must import cleanly: check syntax, names and @triton.jit signatures.",
    "sandbox-violation": "The sandbox blocks files, sockets, processes, threads and imports outside the allowlist.",
    "crash": "The process died: usually an out-of-bounds access (mask every load and store) or a bad pointer.",
    "timeout": "It ran past the time limit: too many program instances or an endless loop.",
    "memory": "It ran out of memory: allocate only the outputs (and small scratch).",
    "raised": "forward raised: handle every shape and dtype the op is called with.",
    "impure": "Keep no state between calls: nothing at module level may change after import (no counters, caches "
              "of tensors, iterators, global/nonlocal writes, self.x = ... outside __init__).",
    "bad-output": "Return new tensors of the op's count, shapes, dtype and device.",
    "aliasing": "Outputs must be freshly allocated, never views of inputs.",
    "input-mutated": "Never write into an input; store only to tensors you allocated.",
    "out-of-bounds": "Every load and store must stay inside the tensor it was given: mask each access with the "
                     "tensor's own extent (rows, columns, strides), never read or write padding or past the end.",
    "mismatch": "Load, then .to(tl.float32) before arithmetic; mask loads with other=0.0; write every output element.",
    "biased": "Compute in float32 and round once to the output dtype (round to nearest, never truncate); use the "
              "op's exact constants (eps, scale): a systematic error compounds over layers even within tolerance.",
    "race": "No program may read what another program of the same launch writes, and no float atomics: split "
            "a reduction into two launches (partials, then a fixed-order sum) or give each output one program.",
    "nondeterministic": "Avoid atomics or any order-dependent accumulation; two calls must give identical bits.",
    "torch-compute": "Only allocation and views may use torch; compute everything in Triton kernels.",
    "no-triton": "forward must launch a Triton kernel.",
    "untraceable": "Define every @triton.jit kernel at the module's top level, pass only inputs and tensors "
                   "allocated inside forward to kernels, and keep module constants plain numbers.",
    "launch-independent": "The result must come from your Triton kernels alone: replaying them must give the same bits.",
    "compile-target": "It must compile for the GPU target without spilling registers or exceeding shared memory: "
                      "use more warps or smaller blocks (loop over long rows in chunks).",
    "not-faster": "Correct, but not faster: change the strategy (grid size, block shape, fewer passes over memory).",
    "timing-incomplete": "Correct, but its timing did not finish within the budget: make it cheaper to run "
                         "(fewer programs, less work per call).",
    "impossible-speedup": "The timing looked faster than the hardware allows; do not cache or skip work.",
    "no-code": "Reply with the complete module in one ```python fenced block.",
    "cut-off": "Be brief: no explanation, only the module in one ```python block, well within the token limit.",
    "truncated": "Write the whole module and close its ```python block with ```.",
    "duplicate": "It was judged already; change the approach instead of sending it again.",
}


def _fmt_s(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def timing_text(verdict: dict) -> str:
    """Speedup, interval, times and roofline of a verdict that reached timing ('' if none)."""
    parts = []
    speedup, interval = verdict.get("speedup"), verdict.get("speedup_interval")
    if speedup is not None:
        s = f"speedup {float(speedup):.3f}x"
        if interval and len(interval) == 2:
            s += f" (95% interval [{float(interval[0]):.3f}, {float(interval[1]):.3f}])"
        parts.append(s + f" over {verdict.get('baseline') or 'baseline'}")
    t = verdict.get("timing") or {}
    if t.get("candidate_s") is not None and t.get("baseline_s") is not None:
        parts.append(f"yours {_fmt_s(t['candidate_s'])} vs baseline {_fmt_s(t['baseline_s'])} per call"
                     + (f" at {json.dumps(t['shape'], sort_keys=True)} {t.get('dtype', '')}".rstrip() if t.get("shape") else ""))
    if t.get("achieved_bytes_per_s") is not None:
        s = f"achieved {gb_per_s(t['achieved_bytes_per_s'])}"
        if t.get("roofline_fraction") is not None:
            s += f" = {100 * float(t['roofline_fraction']):.1f}% of roofline"
        if t.get("copy_bandwidth_bytes_per_s"):
            s += f" (copy bandwidth {gb_per_s(t['copy_bandwidth_bytes_per_s'])})"
        parts.append(s)
    return ("Timing: " + "; ".join(parts) + ".") if parts else ""


def feedback_text(verdict: dict) -> str:
    """What the sandbox said about one candidate, as the next user turn of the conversation."""
    failure = verdict.get("failure")
    reason = safe_text(verdict.get("reason") or "").strip()
    lines: list[str] = []
    if failure is None and verdict.get("accepted"):
        lines.append(f"Accepted: {reason}" if reason else "Accepted.")
    elif failure == "static":
        lines.append(f"Rejected by the static check: {reason}")
    elif failure == "load":
        lines.append(f"Compile/import error: {reason}")
    elif failure in ("sandbox-violation", "crash", "timeout", "memory"):
        lines.append(f"Runtime violation ({failure}): {reason}")
    elif failure == "mismatch":
        lines.append(f"Wrong results (mismatch): {reason}")
    elif failure in CORRECT_FAILURES:
        lines.append(f"Correct, but rejected ({failure}): {reason}")
    elif failure in ("no-code", "cut-off", "truncated"):
        lines.append(f"Nothing could be judged ({failure}): {reason}")
    elif failure == "duplicate":
        lines.append(f"Not judged again (duplicate): {reason}")
    elif failure:
        lines.append(f"Rejected ({failure}): {reason}")
    else:
        lines.append(f"Not accepted: {reason}" if reason else "Not accepted.")
    if verdict.get("batch_invariant") is not None and verdict.get("correct"):
        said = safe_text(verdict.get("invariance_reason") or "").strip()
        lines.append(("Batch invariant: " if verdict["batch_invariant"] else "Not batch invariant: ") + said)
    if failure in ("load", "raised", "crash") and verdict.get("log_tail"):
        tail = safe_text(verdict["log_tail"], multiline=True).strip()[-MAX_LOG_CHARS:]
        lines.append("Last output of the candidate's process:\n```\n" + tail + "\n```")
    timing = timing_text(verdict)
    if timing:
        lines.append(timing)
    if failure in HINTS:
        lines.append("Hint: " + HINTS[failure])
    return "\n".join(lines)


def next_round_text(feedback: str) -> str:
    """A feedback user turn: the verdict, then the request for a better module."""
    return feedback + "\n\nWrite an improved, complete module in one ```python block."


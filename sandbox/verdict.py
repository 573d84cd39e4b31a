"""The verdict: the sandbox's answer about one candidate, and its JSON form (a contract, DESIGN.md).

`failure` is a stable code a program can act on; `reason` is one line a person can act on. Both
`reason` and `log_tail` may quote the candidate (its exception, its output), so they hold
display-safe text (kernels/display.py): no control character reaches a terminal, a PR or a prompt.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from kernelloop.kernels.device import Fingerprint
from kernelloop.kernels.display import safe_text

# Codes of `Verdict.failure`, in the order a run can reach them.
FAILURES = (
    "static",             # rejected before any process started: syntax, signature, forbidden code
    "load",               # the module raised while being imported
    "sandbox-violation",  # a runtime guard blocked an escape (file, network, process, import, thread)
    "crash",              # the process died, or exited before its verdict
    "timeout",            # the wall-clock limit passed
    "memory",             # the memory limit was hit
    "raised",             # forward raised
    "impure",             # the module's state changed after import, or cannot be frozen (counters, caches of tensors, iterators)
    "bad-output",         # not plain tensors of the right count, shape, dtype and device
    "aliasing",           # an output shares memory with an input
    "input-mutated",      # an input changed
    "out-of-bounds",      # a load or store outside the memory it was given (input padding, past an allocation)
    "mismatch",           # wrong values (incl. elements left unwritten, which are poisoned)
    "biased",             # every element within tolerance, but the error's mean or RMS beyond its bound
    "race",               # the bits depend on the order its programs run (shuffled order, or beside a concurrent load)
    "nondeterministic",   # two calls on the same inputs differ bitwise
    "torch-compute",      # torch computed on the candidate's path (only allocation/view/copy/fill allowed)
    "no-triton",          # no Triton kernel was launched
    "untraceable",        # its launches could not be recorded or replayed (memory from nowhere, kernels not at top level)
    "launch-independent",  # replaying its recorded Triton launches does not give the output it returned
    "compile-target",     # --compile-for: a kernel does not compile for a GPU target, spills, or exceeds its shared memory
    "timing-incomplete",  # correct, but the timing rounds did not all finish within the budget (a busy machine, a slow kernel)
    "not-faster",         # correct, but the speedup's lower bound missed the required gain
    "impossible-speedup",  # correct, but faster than the op's roofline allows: the timing is not real
)

CORRECT_FAILURES = ("timing-incomplete", "not-faster", "impossible-speedup")  # these keep `correct: true`


@dataclass
class Check:
    """One correctness trial (or one named check) and its outcome."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class Verdict:
    op: str
    device: Fingerprint              # e.g. "cpu-interpreter", "NVIDIA H200 sm90"
    file: str
    sha256: str
    correct: bool = False
    accepted: bool = False
    speedup: float | None = None     # median over rounds of baseline time / candidate time
    speedup_interval: list[float] | None = None  # its 95% order-statistic interval (common/stats.py)
    reason: str = ""
    failure: str | None = None       # one of FAILURES, None when accepted
    stage: str = "static"            # static | load | correctness | timing | done
    baseline: str = "baseline"       # what the candidate was timed against
    timing: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    isolation: dict[str, str] = field(default_factory=dict)
    log_tail: str = ""               # the candidate's own stdout/stderr, last lines: data, never parsed
    duration_s: float = 0.0
    costs: dict[str, float] = field(default_factory=dict)  # seconds: start (processes), calls, replays
    compile: dict[str, list] = field(default_factory=dict)  # --compile-for: per target, one entry per distinct cubin
    # A property of a correct candidate, not a failure (sandbox/judge/batch_invariance.py): True when its rows'
    # bits do not depend on the batch; None when not probed (an op without independent rows, probe off).
    batch_invariant: bool | None = None
    invariance_reason: str = ""
    # Who judged it, on a cluster (sandbox/cluster): {"actor", "node", "node_id", "pid", "device",
    # "retried"}; None for a verdict of the local judge.
    judged_by: dict[str, Any] | None = None

    def fail(self, failure: str, reason: str) -> "Verdict":
        assert failure in FAILURES, failure
        if self.failure is None:  # the first failure is the verdict's
            self.failure, self.reason = failure, safe_text(reason.splitlines()[0]) if reason else failure
            self.accepted = False
            if failure not in CORRECT_FAILURES:
                self.correct = False
        return self

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Verdict":
        """The inverse of `to_json` (its Check objects rebuilt)."""
        values = dict(data)
        values["checks"] = [Check(**c) for c in values.get("checks", [])]
        return cls(**values)

    def json_line(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))


def judge_or_refuse(sandbox: Any, op: str, source: str, filename: str) -> Verdict:
    """`sandbox.judge_source(op, source, filename)`, total: an exception the candidate's text made the
    judge raise (a parse that recursed too deep or ran out of memory, text that does not encode) becomes
    a `static` verdict, so `agent check` prints it, and a tune run records it and goes on (also after a
    resume). Failures of the machine (OSError, KernelloopError: no confinement, a broken registry) still
    raise: they are not the candidate's, and recording them would condemn it."""
    from kernelloop.common.errors import KernelloopError
    from kernelloop.kernels.display import storable_text
    from kernelloop.kernels.registry.entry import sha256_text

    try:
        return sandbox.judge_source(op, source, filename)
    except (KernelloopError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001  (whatever the candidate's text made the judge do)
        v = Verdict(op=op, device=sandbox.fingerprint, file=filename, sha256=sha256_text(storable_text(source)))
        return v.fail("static", f"the judge could not check this module ({type(exc).__name__}: {str(exc)[:200]})")

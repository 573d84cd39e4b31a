"""The sandbox: judges one candidate kernel against one op spec (docs/ARCHITECTURE.md).

    from kernelloop.sandbox import CheckOptions, judge_files
    verdicts = judge_files("rmsnorm", [Path("cand.py")], CheckOptions(device="cpu"))

Two rooms, and what passes between them:
- judge/ (trusted, the judge's own process): the orchestrator (judge/orchestrator.py: Sandbox,
  judge_files), the plan of trials and timing calls, the budget, the decisions on what came back
  (judge/decisions.py), A/B timing, the compile check, the CUDA check, and the handles on the
  sandboxed processes (children, the fork server).
- inside/ (what runs confined, with the candidate's code in the process or its records): the worker
  (runner, replayer, compile process), tracing a call, replaying it, describing launches, the Python
  guards and the OS confinement (confine.py, seccomp_bpf.py).
- here: the messages and the wire between them, the options, the verdict, process lifetime.
Nothing inside imports the judge's side (tests/test_packaging.py checks it).

Layers: static pre-check (kernels/candidate/static_check.py) -> sandboxed processes from a fork server,
confined by the operating system (inside/confine.py; inside/guards.py as a second layer) -> a runner
calls the candidate on inputs the judge sends and records its launches (inside/worker.py,
inside/trace.py) -> a replayer redoes only those launches, which must give the same bits
(inside/replay.py) -> the judge, in its own process, compares with the reference and times the
replays A/B with a distribution-free interval of the median (judge/orchestrator.py, judge/decisions.py, judge/timing.py).
docs/ARCHITECTURE.md has the threat model.
"""

from typing import Any

# Light (the standard library only); the rules live beside the loader they share with the registry.
from kernelloop.kernels.candidate.static_check import static_check

# Loaded on first use (PEP 562), so that `kernelloop.sandbox.options` and `.budget` stay cheap to
# import (command-line parsing takes its defaults from them) without torch or the fork server.
_EXPORTS = {"CheckOptions": "options", "Sandbox": "judge.orchestrator", "SandboxUnavailable": "judge.orchestrator",
            "judge_files": "judge.orchestrator",
            "Verdict": "verdict", "Check": "verdict", "FAILURES": "verdict"}
__all__ = ["static_check", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"kernelloop.sandbox.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

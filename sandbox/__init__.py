"""The sandbox: judges one candidate kernel against one op spec (docs/ARCHITECTURE.md).

    from kernelloop.sandbox import CheckOptions, judge_files
    verdicts = judge_files("rmsnorm", [Path("cand.py")], CheckOptions(device="cpu"))

Layers: static pre-check (kernels/candidate/static_check.py) -> sandboxed processes from a fork server, confined by
the operating system (forkserver.py, confine.py, guards.py as a second layer) -> a runner calls the
candidate on inputs the judge sends and records its launches (worker.py, trace.py) -> a replayer
redoes only those launches, which must give the same bits (replay.py) -> the judge, in its own
process, compares with the reference and times the replays A/B with a bootstrap interval
(runner.py, judge.py). docs/ARCHITECTURE.md has the threat model.
"""

from typing import Any

# Light (the standard library only); the rules live beside the loader they share with the registry.
from kernelloop.kernels.candidate.static_check import static_check

# Loaded on first use (PEP 562), so that `kernelloop.sandbox.options` and `.budget` stay cheap to
# import (command-line parsing takes its defaults from them) without torch or the fork server.
_EXPORTS = {"CheckOptions": "options", "Sandbox": "runner", "SandboxUnavailable": "runner", "judge_files": "runner",
            "Verdict": "verdict", "Check": "verdict", "FAILURES": "verdict"}
__all__ = ["static_check", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"kernelloop.sandbox.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

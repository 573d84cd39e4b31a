"""The sandbox: judges one candidate kernel against one op spec (DESIGN.md, issue #10).

    from kernelloop.sandbox import CheckOptions, judge_files
    verdicts = judge_files("rmsnorm", [Path("cand.py")], CheckOptions(device="cpu"))

Layers: static pre-check (static_check.py) -> sandboxed processes from a fork server, confined by
the operating system (forkserver.py, confine.py, guards.py as a second layer) -> a runner calls the
candidate on inputs the judge sends and records its launches (worker.py, trace.py) -> a replayer
redoes only those launches, which must give the same bits (replay.py) -> the judge, in its own
process, compares with the reference and times the replays A/B with a bootstrap interval
(runner.py, judge.py). docs/ARCHITECTURE.md has the threat model.
"""

from kernelloop.sandbox.options import CheckOptions
from kernelloop.sandbox.runner import Sandbox, SandboxUnavailable, judge_files
from kernelloop.sandbox.static_check import static_check
from kernelloop.sandbox.verdict import FAILURES, Check, Verdict

__all__ = ["CheckOptions", "Sandbox", "SandboxUnavailable", "judge_files", "static_check", "Verdict", "Check",
           "FAILURES"]

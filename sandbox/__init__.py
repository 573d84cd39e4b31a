"""The sandbox: judges one candidate kernel against one op spec (DESIGN.md, issue #4).

    from sandbox import CheckOptions, judge_files
    verdicts = judge_files("rmsnorm", [Path("cand.py")], CheckOptions(device="cpu"))

Layers: static pre-check (static_check.py) -> isolated process from a fork server (runner.py,
guards.py, worker.py) -> correctness and anti-cheat battery judged in this process against the
reference (plan.py, judge.py) -> interleaved A/B timing with a bootstrap interval (ab_timing.py).
"""

from sandbox.options import CheckOptions
from sandbox.runner import Sandbox, judge_files
from sandbox.static_check import static_check
from sandbox.verdict import FAILURES, Check, Verdict

__all__ = ["CheckOptions", "Sandbox", "judge_files", "static_check", "Verdict", "Check", "FAILURES"]

"""A candidate's time: the per-device default budget and its split between correctness and timing.

Correctness (starting the processes, the battery, the compile check) must end within its share of
the budget; timing then has the rest, never less than its own share. So a slow battery cannot eat
the timing's time, and timing (which comes last) cannot eat the battery's. A candidate cut off while
being timed is still correct: its verdict says `timing-incomplete`, not `timeout`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelloop.sandbox.options import CheckOptions

CORRECTNESS_SHARE = 0.6  # of the budget, when the candidate is timed too


def timeout_s(options: CheckOptions) -> float:
    """The budget of one candidate: the caller's, else the device's default (Device.judge_timeout_s)."""
    if options.timeout_s is not None:
        return float(options.timeout_s)
    return options.device.judge_timeout_s


@dataclass(frozen=True)
class Budget:
    """Deadlines (time.monotonic()) of one candidate's run that began at `start`."""

    start: float
    total_s: float
    timed: bool  # False: no timing phase, correctness may use the whole budget

    @property
    def correctness_s(self) -> float:
        return self.total_s * (CORRECTNESS_SHARE if self.timed else 1.0)

    @property
    def correctness_deadline(self) -> float:
        return self.start + self.correctness_s

    @property
    def deadline(self) -> float:
        return self.start + self.total_s

    def correctness_cut(self) -> str:
        """Why a candidate still being checked for correctness was stopped."""
        if not self.timed:
            return f"no verdict within {self.total_s:g} s"
        return f"correctness not settled within {self.correctness_s:g} s ({CORRECTNESS_SHARE:.0%} of the {self.total_s:g} s budget)"

    def timing_cut(self, done: int, planned: int) -> str:
        """The reason of a correct candidate whose timing rounds did not all finish in time."""
        return f"correct; timing incomplete: {done}/{planned} rounds within {self.total_s:g} s"

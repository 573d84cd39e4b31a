"""The CPU judge against itself (A/A): the op's own kernel judged as a candidate against the op's own
kernel, several times, on an idle machine and under two busy loops, timed by the replayer's CPU time
(what the judge uses) and by the judge's wall clock (what it used before).

Every run is a whole sandbox judgement (correctness battery, then 7 interleaved timing rounds, and 7
confirmation rounds when the first look is unsure); the
table shows how far from 1.0 the speedup interval's lower bound went, and how many of the runs the judge
accepted (its default gain, 1.03).
The candidate and the baseline are the same text, so every acceptance is a false one.

python -m bench.judge_aa [--runs 5] [--op rmsnorm] [--out-dir docs/benchmarks]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

import kernelloop.kernels.ops  # noqa: F401  (configures Triton)
from kernelloop.kernels.ops import get_op
from kernelloop.sandbox import CheckOptions, Sandbox
from kernelloop.sandbox.judge import children

from bench.report import print_table, write_report

ASKED_GAIN = CheckOptions.min_gain
SHAPES = {"rmsnorm": {"tokens": 2, "hidden": 256}, "silu_mul": {"tokens": 2, "d": 256}}
NO_REGISTRY = Path("/nonexistent-kernelloop-registry")  # the op's own kernel is the baseline


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """`n` processes spinning on the cores while the block runs (other work sharing the machine)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@contextlib.contextmanager
def wall_clock_timing() -> Iterator[None]:
    """The judge as it timed before: the wall clock from "go" to the last output byte."""
    own = children.Child._cpu_seconds
    children.Child._cpu_seconds = lambda self, wall: wall
    try:
        yield
    finally:
        children.Child._cpu_seconds = own


def judge_self(op: str, runs: int, progress: str) -> list[tuple[float, float, float, bool, bool]]:
    """(speedup, lower, upper, accepted, confirmed) of `runs` judgements of the op's own kernel against
    itself; confirmed: the first look was unsure and confirmation rounds followed."""
    spec = get_op(op)
    source = inspect.getsource(sys.modules[spec.forward.__module__])
    options = CheckOptions(device="cpu", registry=NO_REGISTRY, dtypes=("bfloat16",), timing_dtype="bfloat16",
                           timing_shape=SHAPES[op], static_check=False, batch_invariance=False)
    out = []
    with Sandbox(options) as sandbox:
        for i in range(runs):
            v = sandbox.judge_source(op, source, "own_kernel.py")
            if not v.correct or not v.speedup_interval:
                raise SystemExit(f"{progress}: the op's own kernel was not judged correct: {v.failure}: {v.reason}")
            lo, hi = v.speedup_interval
            confirmed = "first_look_rounds" in v.timing
            out.append((v.speedup, lo, hi, v.accepted, confirmed))
            print(f"  {progress} run {i + 1}/{runs}: {v.speedup:.3f} [{lo:.3f}, {hi:.3f}]"
                  + (f" after {v.timing['rounds']} rounds" if confirmed else ""), flush=True)
    return out


def row(op: str, load: str, clock: str, results: list[tuple[float, float, float, bool, bool]]) -> dict[str, Any]:
    lows = [r[1] for r in results]
    return {"op": op, "machine": load, "clock": clock, "runs": len(results),
            "median speedup (median of runs)": round(median(r[0] for r in results), 3),
            "lower bounds (min..max)": f"{min(lows):.3f}..{max(lows):.3f}",
            "confirmation rounds run": sum(r[4] for r in results),
            f"accepted (lower bound > {1 + ASKED_GAIN:.2f})": sum(r[3] for r in results)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="judgements per condition (default 5)")
    p.add_argument("--op", choices=sorted(SHAPES), default="rmsnorm")
    p.add_argument("--out-dir", default=None, help="where the report goes (default docs/benchmarks)")
    args = p.parse_args(argv)
    rows = []
    for load, hogs in (("idle", 0), ("2 busy loops", 2)):
        for clock, timing in (("replayer CPU time", contextlib.nullcontext), ("judge wall clock", wall_clock_timing)):
            print(f"{load}, {clock}", flush=True)
            with busy_loops(hogs), timing():
                rows.append(row(args.op, load, clock, judge_self(args.op, args.runs, f"{load}, {clock}")))
    print_table(rows)
    path = write_report(
        "judge-aa", f"The CPU judge against itself: {args.op}'s own kernel as candidate and baseline", rows,
        device="cpu", out_dir=args.out_dir,
        notes=[f"Timed at {SHAPES[args.op]} bfloat16, 7 rounds, each a few interleaved calls per side; the interval "
               "is the distribution-free 95% interval of the median of the rounds' ratios (kernelloop.common.stats).",
               "A first look whose median cleared the bar but whose interval did not was followed by 7 confirmation "
               "rounds (CheckOptions.confirm) and judged on all 14 at the error the first look left: "
               "`confirmation rounds run` counts those judgements.",
               "Candidate and baseline are the same source text in two sandboxed process pairs, so a lower bound "
               "above 1 is a difference between the processes, not between kernels; every acceptance is false.",
               "'judge wall clock' is the judge as it timed before (monkeypatched here for the comparison)."])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The CPU judge's power: how often a real gain is accepted, with and without confirmation rounds.

A candidate that is faster by design (rmsnorm with several rows per program: fewer interpreted
programs, faster than the op's own kernel at 16 rows) is judged against the op's own kernel, several
times, on an idle machine and under two busy loops, with `CheckOptions.confirm` on (the default) and
off. A refusal of this candidate is a false `not-faster`: the judge's cost of a noisy round, which
confirmation rounds are there to pay. bench.judge_aa is the other side: a kernel against itself, where
every acceptance is false.

python -m bench.judge_power [--runs 8] [--out-dir docs/benchmarks]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import median
from typing import Any

import kernelloop.kernels.ops  # noqa: F401  (configures Triton)
from kernelloop.sandbox import CheckOptions, Sandbox

from bench.judge_aa import NO_REGISTRY, busy_loops
from bench.report import print_table, write_report

SHAPE = {"tokens": 200, "hidden": 64}  # timed at 16 rows: its bucket's low end, cut to CPU_TIMING_CAP (sandbox.judge.plan)
FAST = Path(__file__).resolve().parents[1] / "tests" / "sandbox_candidates" / "control_rmsnorm_multirow.py"


def judge_fast(confirm: bool, runs: int, progress: str) -> list[dict[str, Any]]:
    options = CheckOptions(device="cpu", registry=NO_REGISTRY, dtypes=("float32",), timing_shape=SHAPE,
                           batch_invariance=False, confirm=confirm)
    out = []
    with Sandbox(options) as sandbox:
        for i in range(runs):
            v = sandbox.judge_source("rmsnorm", FAST.read_text(), FAST.name)
            if not v.correct or not v.speedup_interval:
                raise SystemExit(f"{progress}: the fast control was not judged correct: {v.failure}: {v.reason}")
            confirmed = "first_look_rounds" in v.timing
            out.append({"speedup": v.speedup, "lo": v.speedup_interval[0], "accepted": v.accepted,
                        "confirmed": confirmed})
            print(f"  {progress} run {i + 1}/{runs}: {v.speedup:.3f} [{v.speedup_interval[0]:.3f}, "
                  f"{v.speedup_interval[1]:.3f}] {'accepted' if v.accepted else v.failure}"
                  + (f" after {v.timing['rounds']} rounds" if confirmed else ""), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8, help="judgements per condition (default 8)")
    p.add_argument("--out-dir", default=None, help="where the report goes (default docs/benchmarks)")
    args = p.parse_args(argv)
    rows = []
    for load, hogs in (("idle", 0), ("2 busy loops", 2)):
        for confirm in (False, True):
            name = f"{load}, confirmation {'on' if confirm else 'off'}"
            print(name, flush=True)
            with busy_loops(hogs):
                got = judge_fast(confirm, args.runs, name)
            rows.append({"machine": load, "confirmation": "on" if confirm else "off", "runs": len(got),
                         "median speedup": round(median(r["speedup"] for r in got), 3),
                         "lower bounds (min..max)": f"{min(r['lo'] for r in got):.3f}..{max(r['lo'] for r in got):.3f}",
                         "confirmation rounds run": sum(r["confirmed"] for r in got),
                         "accepted": sum(r["accepted"] for r in got)})
    print_table(rows)
    path = write_report(
        "judge-power", "The CPU judge's power: a 1.7x rmsnorm against the op's own kernel, confirmation on and off",
        rows, device="cpu", out_dir=args.out_dir,
        notes=["Candidate: tests/sandbox_candidates/control_rmsnorm_multirow.py (several rows per program) against "
               f"the op's own kernel; float32, asked at {SHAPE} and so timed at 16 rows, 7 rounds (14 after a "
               "confirmation); accepted when the interval's lower bound exceeds 1.03.",
               "Every refusal here is a false `not-faster` (the candidate is faster by design); bench.judge_aa "
               "shows the other side (the op's kernel against itself, where every acceptance is false)."])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

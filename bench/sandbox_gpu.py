"""The sandbox's GPU half: `python -m bench.sandbox_gpu [--rehearse] [--out-dir DIR]`.

1. L2 flush: the baseline rmsnorm timed three ways: with a warm L2, after the `zero_()` flush (which
   leaves L2 full of dirty lines for the timed kernel to write back) and after a read-only flush
   (a sum over the same 256 MB: L2 left clean); see kernels/timing.py.
2. A/B timing, baseline vs an honest variant, for rmsnorm and silu_mul: speedup, its 95%
   interval, timing mode (replayed launches, CUDA events after an L2 flush), percent of copy
   bandwidth, verdict; every sandboxed process confined (namespaces, Landlock, seccomp) with CUDA.
3. Baseline vs itself: the interval must contain 1.0 and the verdict must be not-faster.
4. Exploits judged with the static check off, none accepted: work on an unjoined side stream
   (tests/sandbox_candidates_gpu/side_stream.py), a result cached by shape (cached_result.py),
   torch computing out of the dispatch mode's sight after a dummy launch (dispatch_mode_escape.py);
   and Sandbox v3's GPU paths: a def that only compiled Triton's rule would build (l1_*), a store one
   element past the output and into an input's padding (m5_*), and a host memory hog (memory_hog.py);
   races (r1_*: a program reading another's output, a float atomic_add sum), which the judge replays
   beside a concurrent load on CUDA.

Every case is judged with the static check off; for the honest ones the judge runs the same check
(`sandbox.static_check`) itself first, so the cases need only one sandbox (one fork server) per
timing shape: two in all. The report is rewritten after every case ("PARTIAL" until the last), so a
run killed by its timeout keeps what it measured.

`--rehearse` runs this same path on CPU (Triton's interpreter, TRITON_INTERPRET=1) at tiny shapes,
to catch what would crash on the GPU; its timings describe the interpreter.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

import kernelloop.kernels.ops  # noqa: F401  (configures Triton)
from kernelloop.kernels.device import CPU, CUDA, Device
from kernelloop.kernels.ops import get_op
from kernelloop.kernels.timing import summarize, time_calls
from kernelloop.sandbox import CheckOptions, Sandbox, SandboxUnavailable, Verdict, static_check

from bench.rehearse import step_device
from bench.report import print_table, write_report

TESTS = Path(__file__).resolve().parents[1] / "tests"
NO_REGISTRY = Path("/nonexistent-kernelloop-registry")  # the op's own kernel is every case's baseline
DTYPE = "bfloat16"  # checked and timed; the tune loop, too, checks only the dtype it tunes

# The "small" (decode) timing shape; the others take the sandbox's default (a mid-size engine shape
# on CUDA, the costliest test shape on CPU).
SMALL = {CUDA: {"tokens": 1, "hidden": 4096}, CPU: {"tokens": 2, "hidden": 256}}
L2_SHAPE = {CUDA: {"tokens": 4096, "hidden": 4096}, CPU: {"tokens": 4, "hidden": 256}}
L2_CALLS = {CUDA: (5, 50), CPU: (1, 3)}  # (warmup, reps) per flush kind
L2_FLUSHES = (("warm L2", False), ("flush: zero_() (write)", "write"), ("flush: read (sum)", "read"))
JUDGE_TIMEOUT_S = {CUDA: 60.0, CPU: 120.0}
# Baseline vs itself: how far the interval may sit from 1.0 (interpreter timings are noisy).
SELF_SLACK = {CUDA: (0.0, 0.02), CPU: (0.25, 0.25)}  # (above, below)


@dataclass(frozen=True)
class Case:
    name: str
    op: str
    path: Path
    small: bool  # timed at SMALL; else at the sandbox's default timing shape
    kind: str    # "variant" | "self" | "exploit"
    dtype: str = DTYPE  # checked and timed in


CASES = (
    Case("variant, engine shape", "rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_multirow.py", False,
         "variant"),
    Case("variant, engine shape", "silu_mul", TESTS / "sandbox_candidates" / "control_silu_mul_flat.py", False,
         "variant"),
    Case("variant, decode shape", "rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_multirow.py", True,
         "variant"),
    Case("baseline vs itself", "rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_row.py", True, "self"),
    Case("exploit: side stream", "rmsnorm", TESTS / "sandbox_candidates_gpu" / "side_stream.py", True, "exploit"),
    Case("exploit: cached result", "rmsnorm", TESTS / "sandbox_candidates" / "cached_result.py", True, "exploit"),
    Case("exploit: torch out of sight", "rmsnorm", TESTS / "sandbox_candidates" / "dispatch_mode_escape.py", True,
         "exploit"),
    # Sandbox v3's layers on the GPU's own paths: the canonical text under compiled Triton's rule, guard
    # zones and the whole storage behind a view on CUDA, the memory rlimit beside the CUDA driver. (Last:
    # a step cut by its timeout keeps the rows before them.)
    # Races: programs that read another program's output, float atomics; repeated beside a load.
    Case("exploit: race, the last program finalizes", "rmsnorm",
         TESTS / "sandbox_candidates" / "r1_last_program_finalizes.py", True, "exploit"),
    # In float32: rounding to bfloat16 hides most orders of a float32 sum in the output's bits (a seed can
    # hide them all), while float32 outputs show them.
    Case("exploit: race, float atomic_add", "rmsnorm", TESTS / "sandbox_candidates" / "r1_float_atomic_add_sum.py",
         True, "exploit", "float32"),
    Case("exploit: a def only compiled Triton would build", "rmsnorm",
         TESTS / "sandbox_candidates" / "l1_decorator_def_gpu_only.py", True, "exploit"),
    Case("exploit: store past its output", "rmsnorm", TESTS / "sandbox_candidates" / "m5_store_past_output.py", True,
         "exploit"),
    Case("exploit: input padding as scratch", "rmsnorm",
         TESTS / "sandbox_candidates" / "m5_store_into_input_padding.py", True, "exploit"),
    Case("exploit: host memory hog", "rmsnorm", TESTS / "sandbox_candidates" / "memory_hog.py", True, "exploit"),
)


def grouped(cases: tuple[Case, ...] | list[Case]) -> list[Case]:
    """The cases with those of one timing shape and dtype (one sandbox) together, in order of first appearance."""
    order: dict[tuple[bool, str], list[Case]] = {}
    for case in cases:
        order.setdefault((case.small, case.dtype), []).append(case)
    return [case for group in order.values() for case in group]


def options_for(device: Device, small: bool, dtype: str = DTYPE) -> CheckOptions:
    return CheckOptions(device=device, registry=NO_REGISTRY, dtypes=(dtype,), timing_dtype=dtype,
                        timing_shape=SMALL[device] if small else None, static_check=False,
                        timeout_s=JUDGE_TIMEOUT_S[device])


class Sandboxes:
    """One open Sandbox at a time, for the current timing shape and dtype; a new one only when they change."""

    def __init__(self, device: Device) -> None:
        self.device, self.started = device, 0
        self._key: tuple[bool, str] | None = None
        self._sandbox: Sandbox | None = None

    def get(self, small: bool, dtype: str = DTYPE) -> Sandbox:
        if self._sandbox is None or self._key != (small, dtype):
            self.close()
            self._sandbox, self._key = Sandbox(options_for(self.device, small, dtype)), (small, dtype)
            self.started += 1
        return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
        self._sandbox = self._key = None


def case_ok(case: Case, v: Verdict, static_ok: bool, device: Device) -> bool:
    """What the case must show, on CUDA and on the CPU rehearsal alike."""
    if case.kind == "exploit":  # the side stream may be correct (it is an honest kernel), never accepted
        return not v.accepted and (case.name.endswith("side stream") or not v.correct)
    if not (static_ok and v.correct):
        return False
    if case.kind == "self":
        if v.accepted or not v.speedup_interval:
            return False
        above, below = SELF_SLACK[device]
        lo, hi = v.speedup_interval
        return lo <= 1.0 + above and hi >= 1.0 - below
    return True


def row_of(case: Case, v: Verdict | None, static: str, ok: bool, error: str = "") -> dict[str, Any]:
    t = (v.timing if v is not None else None) or {}
    row = {"case": case.name, "op": case.op,
           "shape": ",".join(f"{k}={x}" for k, x in t.get("shape", {}).items()) or "-",
           "mode": "+".join(t.get("modes", [])) or "-",
           "baseline us": f"{t['baseline_s'] * 1e6:.1f}" if t else "-",
           "candidate us": f"{t['candidate_s'] * 1e6:.1f}" if t else "-",
           "speedup": "-", "% copy bw": f"{100 * t['roofline_fraction']:.0f}" if t.get("roofline_fraction") else "-",
           "static": static}
    if v is not None and v.speedup and v.speedup_interval:
        row["speedup"] = f"{v.speedup:.3f} [{v.speedup_interval[0]:.3f}, {v.speedup_interval[1]:.3f}]"
    if error:
        row["verdict"] = error[:120]
    elif v is not None:
        row["verdict"] = "accepted" if v.accepted else (v.failure or "correct")
        if v.failure:  # what went wrong, in the verdict's words: a GPU lease has one try to learn it
            row["verdict"] += f": {' '.join(v.reason.split())}"[:160]
    row["check"] = "ok" if ok else "FAILED"
    return row


def judge_case(case: Case, sandboxes: Sandboxes) -> tuple[Verdict | None, str, bool]:
    """(verdict or None when the static check refused an honest case, static column, case passed)."""
    source = case.path.read_text()
    static = static_check(source, get_op(case.op).arg_names)
    if not static.ok and case.kind != "exploit":
        return None, f"refused: {static.reason}"[:80], False
    v = sandboxes.get(case.small, case.dtype).judge_source(case.op, source, str(case.path))
    return v, "pass" if static.ok else "refuses (judged off)", case_ok(case, v, static.ok, sandboxes.device)


def run_cases(cases: list[Case], judge: Callable[[Case], tuple[Verdict | None, str, bool]],
              rows: list[dict[str, Any]], report: Callable[[str], Any]) -> bool:
    """Judge every case in order, appending its row and rewriting the report after each one
    ("PARTIAL" until the last case). A case that raises is a failed row, never the end of the run."""
    ok = True
    for i, case in enumerate(cases, 1):
        try:
            v, static, passed = judge(case)
            rows.append(row_of(case, v, static, passed))
        except Exception as exc:  # noqa: BLE001  (e.g. no confinement here: a row, and the next case)
            passed = False
            rows.append(row_of(case, None, "-", False, error=f"error: {type(exc).__name__}: {exc}"))
        ok &= passed
        print(rows[-1], flush=True)
        report("" if i == len(cases) else f"PARTIAL: {i} of {len(cases)} cases judged, stopped after "
               f"{case.name} ({case.op})")
    return ok


def l2_rows(device: Device) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The baseline rmsnorm timed after each kind of flush (CPU: no flush, the path only)."""
    rms, shape = get_op("rmsnorm"), L2_SHAPE[device]
    inputs = rms.make_inputs(shape, torch.bfloat16, 0, device.torch)
    warmup, reps = L2_CALLS[device]
    rows, medians = [], {}
    for label, flush in L2_FLUSHES:
        medians[label] = summarize(time_calls(lambda: rms.forward(*inputs), device, warmup=warmup, reps=reps,
                                              flush_l2=flush))["median"]
        device.synchronize()
        mode = "wall clock (cpu-interpreter: no L2, nothing flushed)" if device.interpreted else "cuda events"
        rows.append({"case": f"L2: {label}", "op": "rmsnorm", "shape": ",".join(f"{k}={x}" for k, x in shape.items()),
                     "mode": mode, "baseline us": f"{medians[label] * 1e6:.1f}", "candidate us": "-", "speedup": "-",
                     "% copy bw": "-", "static": "-", "verdict": "-", "check": "ok"})
        print(f"L2 {label}: rmsnorm {rows[-1]['shape']} bf16 median {medians[label] * 1e6:.1f} us", flush=True)
    return rows, medians


def l2_note(device: Device, medians: dict[str, float]) -> str:
    if not medians:
        return "L2 flush: not measured (see the L2 row)."
    warm, write, read = (medians[label] for label, _ in L2_FLUSHES)
    shape = "x".join(str(x) for x in L2_SHAPE[device].values())
    text = (f"L2 flush: rmsnorm {shape} bf16 median {warm * 1e6:.1f} us with a warm L2, {write * 1e6:.1f} us after "
            f"zero_() of 256 MB (kernels.timing's default, and the sandbox replayer's), {read * 1e6:.1f} us after a "
            f"read-only flush (int64 sum of the same 256 MB); zero_()/read = {write / max(read, 1e-12):.3f}")
    if device.interpreted:
        return text + " (CPU rehearsal: nothing is flushed; the numbers time the interpreter and mean nothing here)."
    return text + ": above 1, the timed kernel pays for writing back the zero_() flush's dirty lines."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rehearse", action="store_true",
                        help="run this step's path on CPU (Triton interpreter, tiny shapes; needs TRITON_INTERPRET=1)")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    device = step_device(args.rehearse, "sandbox_gpu")
    if device is None:
        return 1
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    cases = grouped(CASES)
    sandboxes = Sandboxes(device)
    medians: dict[str, float] = {}

    def report(status: str) -> Path:
        ok = all(r.get("check") == "ok" for r in rows)
        notes = ([status] if status else []) + [
            l2_note(device, medians),
            "Timing: interleaved A/B rounds, fresh inputs for every timed call, each call checked; the timed part is "
            "the replay of the call's recorded launches in a process where no candidate Python runs, "
            + ("the replayer's CPU time, read by the judge from /proc (cpu-interpreter)." if device.interpreted else
               "CUDA events after a 256 MB zero_() L2 flush."),
            f"Checked and timed in {DTYPE}; every case judged with the sandbox's static check off (the `static` column "
            "is that check, run by the judge: honest cases must pass it, exploits are judged past it); "
            f"{sandboxes.started} sandbox(es) (fork servers) started, one per timing shape.",
            f"checks {'so far ' if status else ''}{'passed' if ok else 'FAILED'}: honest variants correct; "
            "baseline vs itself correct, not accepted "
            "and its interval around 1.0; no exploit accepted, none but the side stream even correct.",
            f"wall time {time.perf_counter() - start:.0f} s.",
        ]
        return write_report("sandbox-gpu", "Sandbox on the GPU: timing modes, variants, exploits", rows,
                            device=device.torch, notes=notes, out_dir=args.out_dir)

    try:
        l2, medians = l2_rows(device)
        rows += l2
    except Exception as exc:  # noqa: BLE001  (the cases still run)
        rows.append({"case": "L2 flush", "op": "rmsnorm", "verdict": f"error: {type(exc).__name__}: {exc}"[:120],
                     "check": "FAILED"})
    report(f"PARTIAL: L2 measured, 0 of {len(cases)} cases judged")
    try:
        sandboxes.get(cases[0].small, cases[0].dtype)  # confinement and (on CUDA) CUDA inside it, checked once
    except SandboxUnavailable as exc:  # the machine's, not any case's: said once and whole
        print(f"bench.sandbox_gpu: {exc}", flush=True)
        rows.append({"case": "the sandbox itself", "op": "-", "verdict": "unavailable (the notes say why)",
                     "check": "FAILED"})
        print(f"wrote {report(f'sandbox unavailable: {exc}')}: checks FAILED")
        return 1
    try:
        run_cases(cases, lambda case: judge_case(case, sandboxes), rows, report)
    finally:
        sandboxes.close()
    print_table(rows)
    path = report("")  # run_cases wrote it after the last case too; again, with the table printed and the time
    ok = all(r.get("check") == "ok" for r in rows)
    print(f"wrote {path} ({time.perf_counter() - start:.0f} s): checks {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

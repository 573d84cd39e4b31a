"""Baseline Triton kernels against torch eager and the copy-bandwidth roofline, for every op.

    python -m bench.baselines [--device cuda|cpu] [--dtypes bfloat16,float16] [--quick]
                              [--max-shapes-per-op N] [--ops a,b] [--out-dir DIR] [--strict] [--rehearse]

For each op in `kernels.OPS` (decode_attention first: the only tl.dot kernel, the likeliest to
fail, measured while the time budget is whole), each shape (engine shapes on CUDA, evenly
subsampled; test shapes with --quick or on CPU) and each dtype: check `spec.forward` against
`spec.reference` once (seed 0), time both with `kernels.timing`, and report achieved GB/s and the
share of the copy-bandwidth roofline measured at the start of the same run. A failing or raising
kernel becomes a row of the table, never a crash. The table is printed and written with
`bench.report.write_report`, after every op too ("PARTIAL"), so a run killed by its timeout keeps
what it measured.

`--rehearse` (gpu_check.sh's CPU rehearsal) runs the same path on CPU through Triton's interpreter
(TRITON_INTERPRET=1): every test shape, bfloat16 only, a 30 s time budget.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

import kernels  # noqa: F401  (configures Triton before any kernel module is imported)
from bench.rehearse import step_device
from bench.report import device_facts, print_table, write_report
from kernels import OPS
from kernels.compare import check_outputs
from kernels.device import default_device, device_fingerprint, triton_interpreted
from kernels.spec import OpSpec, Shape, dtype_name, parse_dtype, pick_shapes
from kernels.timing import auto_reps, measure_copy_bandwidth, summarize, time_calls

DEFAULT_MAX_SHAPES = 12  # evenly spaced over engine_shapes: every model, decode and prefill
DEFAULT_TIME_BUDGET_S = 210.0  # rows left when it is spent are reported as skipped
FIRST_OPS = ("decode_attention",)  # the only tl.dot kernel, the likeliest to fail: measured first
REHEARSAL = {"dtypes": "bfloat16", "max_shapes_per_op": 0, "time_budget_s": 30.0}  # 0: every test shape


def gpu_order(names: Sequence[str]) -> list[str]:
    """`names` with FIRST_OPS first (in that order), the rest in their given order."""
    first = [n for n in FIRST_OPS if n in names]
    return first + [n for n in names if n not in first]


@dataclass(frozen=True)
class RepPolicy:
    target_s: float  # time the timed reps of one measurement should fill
    min_reps: int
    max_reps: int


CUDA_POLICY = RepPolicy(target_s=0.05, min_reps=10, max_reps=200)
CPU_POLICY = RepPolicy(target_s=0.05, min_reps=2, max_reps=10)  # the interpreter: ~1 ms per program


def shape_str(shape: Shape) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def _fresh(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def measure(fn: Any, device: str, policy: RepPolicy) -> float:
    """Median seconds per call, reps chosen to fill about `policy.target_s`."""
    reps, _ = auto_reps(fn, device, target_s=policy.target_s, min_reps=policy.min_reps, max_reps=policy.max_reps)
    return summarize(time_calls(fn, device, warmup=max(1, reps // 10), reps=reps))["median"]


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()  # surfaces asynchronous kernel errors here, inside the try


def bench_one(spec: OpSpec, shape: Shape, dtype: torch.dtype, device: str, policy: RepPolicy,
              copy_bw: float, problems: list[str]) -> dict[str, Any]:
    """One table row: check, Triton and eager medians, speedup, GB/s, % of roofline."""
    row: dict[str, Any] = {"op": spec.name, "shape": shape_str(shape), "dtype": dtype_name(dtype), "check": "ok",
                           "triton us": None, "eager us": None, "speedup": None, "GB/s": None, "% roofline": None}
    where = f"{spec.name} {row['shape']} {row['dtype']}"

    def problem(kind: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else _error(exc)
        problems.append(f"{where}: {kind}: {text}")
        if row["check"] == "ok":
            row["check"] = f"{kind}: {text}"[:60]

    try:
        args = spec.make_inputs(shape, dtype, 0, device)
    except Exception as exc:
        problem("error in make_inputs", exc)
        return row
    expected = out = None
    try:
        expected = spec.reference(*_fresh(args))
        _sync(device)
    except Exception as exc:
        problem("error in reference", exc)
    forward_ran = False
    try:
        out = spec.forward(*_fresh(args))
        _sync(device)
        forward_ran = True
    except Exception as exc:
        problem("error in forward", exc)
    if forward_ran and expected is not None:
        verdict = check_outputs(spec, out, expected, dtype, shape=shape)
        ok, reason = verdict.ok, verdict.reason
        if not ok:
            problem("FAIL", reason)
    del expected, out
    triton_s = eager_s = None
    if forward_ran:
        try:
            triton_s = measure(lambda: spec.forward(*args), device, policy)
        except Exception as exc:
            problem("error timing forward", exc)
    try:
        eager_s = measure(lambda: spec.reference(*args), device, policy)
    except Exception as exc:
        problem("error timing reference", exc)
    if triton_s:
        row["triton us"] = triton_s * 1e6
        try:
            nbytes = spec.cost(shape, dtype).bytes
            row["GB/s"] = nbytes / triton_s / 1e9
            row["% roofline"] = 100.0 * (nbytes / copy_bw) / triton_s if copy_bw > 0 else None
        except Exception as exc:
            problem("error in cost", exc)
    if eager_s:
        row["eager us"] = eager_s * 1e6
    if triton_s and eager_s:
        row["speedup"] = eager_s / triton_s
    return row


def run_notes(device: str, policy: RepPolicy, copy_bw: float, engine: bool, args: argparse.Namespace,
              dtypes: list[torch.dtype]) -> list[str]:
    """What the columns mean and how they were measured."""
    timing = ("CUDA events around each call after a 256 MB L2 flush outside the timed region"
              if device == "cuda" else "time.perf_counter per call")
    return [
        "triton: the op's baseline Triton kernel (`spec.forward`); eager: its torch reference (`spec.reference`, "
        "float32 math) run eagerly; speedup = eager median / triton median, both measured in this run.",
        "check: `spec.forward` against `spec.reference` on seed-0 inputs with the op's tolerance "
        "(kernels.compare.check_outputs); FAIL or error rows are listed in full below.",
        f"GB/s = spec.cost(shape, dtype).bytes / triton median. % roofline = (bytes / copy bandwidth) / triton "
        f"median, with copy bandwidth {copy_bw / 1e9:.1f} GB/s (device-to-device copy, read + write) measured "
        "at the start of this run.",
        f"timing: kernels.timing.time_calls, {timing}; reps chosen to fill ~{policy.target_s * 1e3:.0f} ms "
        f"({policy.min_reps}-{policy.max_reps}); medians.",
        f"shapes: {'engine_shapes' if engine else 'test_shapes'}, evenly subsampled to at most "
        f"{args.max_shapes_per_op or 'all'} per op; dtypes: {', '.join(dtype_name(d) for d in dtypes)}.",
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.baselines", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--dtypes", default=None, help="comma-separated (default: bfloat16,float16)")
    p.add_argument("--quick", action="store_true", help="use each op's small test_shapes")
    p.add_argument("--max-shapes-per-op", type=int, default=None,
                   help=f"evenly subsample each op's shapes to at most N (default {DEFAULT_MAX_SHAPES}; 0: all)")
    p.add_argument("--ops", default="", help="comma-separated op names (default: every op)")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help=f"stop measuring after this long; later rows are marked skipped (default "
                        f"{DEFAULT_TIME_BUDGET_S:.0f}; 0: no limit)")
    p.add_argument("--out-dir", default=None, help="where the report goes (default: docs/benchmarks)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check failed or raised")
    p.add_argument("--rehearse", action="store_true",
                   help="the GPU step's path on CPU (needs TRITON_INTERPRET=1): --device cpu --quick, and unless "
                        "given --dtypes bfloat16 --max-shapes-per-op 0 --time-budget-s 30")
    args = p.parse_args(argv)
    if args.rehearse:
        if args.device == "cuda":
            p.error("--rehearse runs on CPU; drop --device cuda")
        args.device, args.quick = "cpu", True
        for key, value in REHEARSAL.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    defaults = {"dtypes": "bfloat16,float16", "max_shapes_per_op": DEFAULT_MAX_SHAPES,
                "time_budget_s": DEFAULT_TIME_BUDGET_S}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device or default_device()
    if args.rehearse and step_device(True, "bench.baselines") is None:
        return 2
    if device == "cuda" and (not torch.cuda.is_available() or triton_interpreted()):
        print("bench.baselines: --device cuda needs a CUDA device and TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    if device == "cpu" and not triton_interpreted():
        print("bench.baselines: --device cpu needs TRITON_INTERPRET=1 on a machine with CUDA", file=sys.stderr)
        return 2
    try:
        dtypes = [parse_dtype(d.strip()) for d in args.dtypes.split(",") if d.strip()]
        names = gpu_order([n.strip() for n in args.ops.split(",") if n.strip()] or list(OPS))
        specs = [kernels.get_op(n) for n in names]
    except Exception as exc:
        print(f"bench.baselines: {exc}", file=sys.stderr)
        return 2
    engine = device == "cuda" and not args.quick
    policy = CUDA_POLICY if device == "cuda" else CPU_POLICY
    fingerprint = device_fingerprint(device)

    def log(msg: str) -> None:
        print(f"[baselines] {msg}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    device_facts(device)  # cached now, while the device is surely healthy
    log(f"device {fingerprint}; measuring copy bandwidth")
    try:
        copy_bw = measure_copy_bandwidth(device)
    except Exception as exc:  # no roofline column then, but the rest of the table still counts
        copy_bw = 0.0
        log(f"copy bandwidth measurement failed: {_error(exc)}")
    log(f"copy bandwidth {copy_bw / 1e9:.1f} GB/s")

    def write(rows: list[dict[str, Any]], problems: list[str], elapsed: float, skipped: int, status: str) -> Path:
        notes = ([status] if status else []) + run_notes(device, policy, copy_bw, engine, args, dtypes)
        notes += [f"wall time {elapsed:.0f} s; {len(problems)} problem(s); {skipped} row(s) skipped by the "
                  f"{args.time_budget_s:.0f} s time budget."]
        notes += [f"problem: {p}" for p in problems]
        title = f"Baseline Triton kernels vs torch eager on {fingerprint}"
        return write_report("baselines", title, rows, device=device, notes=notes, out_dir=args.out_dir)

    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    skipped_budget = 0
    for i, spec in enumerate(specs, 1):
        all_shapes = spec.engine_shapes if engine else spec.test_shapes
        shapes = pick_shapes(all_shapes, args.max_shapes_per_op)
        op_start = time.perf_counter()
        log(f"[{i}/{len(specs)}] {spec.name}: {len(shapes)} of {len(all_shapes)} "
            f"{'engine' if engine else 'test'} shapes x {len(dtypes)} dtypes")
        for shape in shapes:
            for dtype in dtypes:
                base = {"op": spec.name, "shape": shape_str(shape), "dtype": dtype_name(dtype)}
                if dtype not in spec.dtypes:
                    rows.append({**base, "check": "skipped: dtype not supported"})
                    continue
                if args.time_budget_s > 0 and time.perf_counter() - start > args.time_budget_s:
                    rows.append({**base, "check": "skipped: time budget spent"})
                    skipped_budget += 1
                    continue
                try:
                    rows.append(bench_one(spec, shape, dtype, device, policy, copy_bw, problems))
                except Exception as exc:  # e.g. out of memory while comparing: still one row, not a crash
                    problems.append(f"{spec.name} {base['shape']} {base['dtype']}: error: {_error(exc)}")
                    rows.append({**base, "check": f"error: {_error(exc)}"[:60]})
                r = rows[-1]
                us = "-" if r["triton us"] is None else f"{r['triton us']:.1f}"
                log(f"    {spec.name} {r['shape']} {r['dtype']}: {r['check']}, triton {us} us")
        log(f"    {spec.name} done in {time.perf_counter() - op_start:.1f} s")
        if i < len(specs):  # a partial report survives a run killed by its timeout
            write(rows, problems, time.perf_counter() - start, skipped_budget, f"PARTIAL: stopped after {spec.name}")
    elapsed = time.perf_counter() - start
    print_table(rows)
    path = write(rows, problems, elapsed, skipped_budget, "")
    log(f"{len(rows)} rows, {len(problems)} problem(s), {elapsed:.1f} s; wrote {path}")
    for p in problems:
        log(f"problem: {p}")
    return 1 if args.strict and problems else 0


if __name__ == "__main__":
    sys.exit(main())

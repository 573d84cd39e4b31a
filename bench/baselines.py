"""Baseline Triton kernels against what torch users would run and against the roofline, for every op.

    python -m bench.baselines [--device cuda|cpu] [--dtypes bfloat16,float16] [--quick]
                              [--max-shapes-per-op N] [--ops a,b] [--time-budget-s S] [--input-workers N]
                              [--out-dir DIR] [--strict] [--rehearse]

Rows (`bench.baseline_plan`): each op at its shapes (engine shapes on CUDA, evenly subsampled;
linear and extend_attention at Llama-3-8B's shapes; test shapes with --quick or on CPU) in each
dtype; decode rows before prefill rows, the tl.dot kernels first. For each row: check `spec.forward`
against `spec.reference` once (seed-0 inputs), time it with `kernels.timing` next to its torch
counterpart (`bench.counterparts`: cuBLAS `F.linear` for linear, SDPA for extend_attention, the
eager reference for the rest; checked against the reference too), and report GB/s, TFLOP/s and the
share of the roofline: max(bytes / copy bandwidth, FLOPs / matmul peak in the dtype)
(`kernels.roofline`), with the side that bounds it. A failing or raising kernel becomes a row of the
table, never a crash. Inputs are drawn on the CPU by worker threads ahead of their rows
(`bench.prefetch`). The table is printed and written with `bench.report.write_report`, after every
group of rows too ("PARTIAL"), so a run killed by its timeout keeps what it measured.

`--rehearse` (gpu_check.sh's CPU rehearsal) runs the same path on CPU through Triton's interpreter
(TRITON_INTERPRET=1): two test shapes per op, bfloat16 only, a 30 s time budget.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

import kernelloop.kernels.ops  # noqa: F401  (configures Triton before any kernel module is imported)
from kernelloop.kernels import OPS, get_op
from kernelloop.kernels.compare import check_outputs
from kernelloop.kernels.device import DEVICES, Device, default_device, triton_interpreted
from kernelloop.kernels.roofline import Rates, matmul_peak
from kernelloop.kernels.spec import OpSpec, Shape, dtype_name, parse_dtype
from kernelloop.kernels.timing import auto_reps, measure_copy_bandwidth, summarize, time_calls

from bench.baseline_plan import gpu_order, groups, plan_rows  # noqa: F401  (gpu_order: bench.tune_gpu imports it here)
from bench.counterparts import Counterpart, counterpart
from bench.prefetch import InputPrefetcher, default_workers, to_device
from bench.rehearse import step_device
from bench.report import device_facts, print_table, write_report

DEFAULT_MAX_SHAPES = 12  # evenly spaced over engine_shapes: every model, decode and prefill
DEFAULT_TIME_BUDGET_S = 210.0  # rows left when it is spent are reported as skipped
# Two test shapes per op (first and last) prove each step's path; tests/test_ops.py checks them all.
REHEARSAL = {"dtypes": "bfloat16", "max_shapes_per_op": 2, "time_budget_s": 30.0}


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


def measure(fn: Any, device: Device, policy: RepPolicy) -> float:
    """Median seconds per call, reps chosen to fill about `policy.target_s`."""
    reps, _ = auto_reps(fn, device, target_s=policy.target_s, min_reps=policy.min_reps, max_reps=policy.max_reps)
    return summarize(time_calls(fn, device, warmup=max(1, reps // 10), reps=reps))["median"]


def bench_one(spec: OpSpec, shape: Shape, dtype: torch.dtype, device: Device, policy: RepPolicy, rates: Rates,
              problems: list[str], inputs: tuple | None = None) -> dict[str, Any]:
    """One table row: check, Triton and torch medians, speedup, GB/s, TFLOP/s, % of roofline, bound.
    `inputs`: the row's seed-0 inputs drawn on the CPU (moved to `device` here); None draws them here."""
    row: dict[str, Any] = {"op": spec.name, "shape": shape_str(shape), "dtype": dtype_name(dtype), "check": "ok",
                           "triton us": None, "torch us": None, "torch": None, "torch err/tol": None,
                           "speedup": None, "GB/s": None, "TFLOP/s": None, "% roofline": None, "bound": None}
    where = f"{spec.name} {row['shape']} {row['dtype']}"

    def problem(kind: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else _error(exc)
        problems.append(f"{where}: {kind}: {text}")
        if row["check"] == "ok":
            row["check"] = f"{kind}: {text}"[:60]

    try:
        args = to_device(inputs, device.torch) if inputs is not None else spec.make_inputs(shape, dtype, 0, device.torch)
    except Exception as exc:
        problem("error in make_inputs", exc)
        return row
    expected = out = None
    try:
        expected = spec.reference(*_fresh(args))
        device.synchronize()  # surfaces asynchronous kernel errors here, inside the try
    except Exception as exc:
        problem("error in reference", exc)
    forward_ran = False
    try:
        out = spec.forward(*_fresh(args))
        device.synchronize()  # surfaces asynchronous kernel errors here, inside the try
        forward_ran = True
    except Exception as exc:
        problem("error in forward", exc)
    if forward_ran and expected is not None:
        verdict = check_outputs(spec, out, expected, dtype, shape=shape)
        if not verdict.ok:
            problem("FAIL", verdict.reason)
    del out
    torch_cp = None
    try:
        torch_cp = against_torch(spec, args, expected, dtype, shape, device, row)
    except Exception as exc:
        problem("error in the torch counterpart", exc)
    del expected
    triton_s = torch_s = None
    if forward_ran:
        try:
            triton_s = measure(lambda: spec.forward(*args), device, policy)
        except Exception as exc:
            problem("error timing forward", exc)
    if torch_cp is not None:
        try:
            with torch_cp.context():
                torch_s = measure(torch_cp.call, device, policy)
        except Exception as exc:
            problem("error timing torch", exc)
    if triton_s:
        row["triton us"] = triton_s * 1e6
        try:
            cost = spec.cost(shape, dtype)
            row["GB/s"] = cost.bytes / triton_s / 1e9
            row["TFLOP/s"] = cost.flops / triton_s / 1e12
            row["% roofline"] = 100.0 * rates.seconds(cost) / triton_s
            row["bound"] = rates.bound(cost)
        except Exception as exc:
            problem("error in cost", exc)
    if torch_s:
        row["torch us"] = torch_s * 1e6
    if triton_s and torch_s:
        row["speedup"] = torch_s / triton_s
    return row


def against_torch(spec: OpSpec, args: tuple, expected: Any, dtype: torch.dtype, shape: Shape, device: Device,
                  row: dict[str, Any]) -> Counterpart:
    """The row's torch counterpart (`bench.counterparts`), its output checked against the reference:
    row["torch"] names it, row["torch err/tol"] is its worst error over the op's tolerance (<= 1: within)."""
    def accept(out: Any) -> bool:
        return expected is None or check_outputs(spec, out, expected, dtype, shape=shape).ok

    cp = counterpart(spec, args, accept)
    row["torch"] = cp.label
    if cp.checked and expected is not None:
        with cp.context():
            out = cp.output(cp.call())
        device.synchronize()  # surfaces asynchronous kernel errors here, inside the try
        row["torch err/tol"] = check_outputs(spec, out, expected, dtype, shape=shape).tol_fraction
    return cp


def device_rates(device: Device, dtypes: Sequence[torch.dtype], copy_bw: float, log: Any) -> dict[torch.dtype, Rates]:
    """The roofline per dtype: this run's copy bandwidth and `kernels.roofline.matmul_peak` (measured
    once per device and dtype, then cached); without a peak, the roofline is the bytes alone."""
    rates = {}
    for dtype in dtypes:
        try:
            peak = matmul_peak(device, dtype)
        except Exception as exc:
            peak = math.inf
            log(f"matmul peak ({dtype_name(dtype)}) failed: {_error(exc)}; roofline from bytes only")
        rates[dtype] = Rates(copy_bw if copy_bw > 0 else math.inf, peak)
        log(f"roofline {dtype_name(dtype)}: {copy_bw / 1e9:.1f} GB/s, {peak / 1e12:.1f} TFLOP/s matmul peak")
    return rates


def run_notes(device: Device, policy: RepPolicy, rates: dict[torch.dtype, Rates], engine: bool,
              args: argparse.Namespace, dtypes: list[torch.dtype]) -> list[str]:
    """What the columns mean and how they were measured."""
    timing = ("CUDA events around each call after a 256 MB L2 flush outside the timed region"
              if not device.interpreted else "time.perf_counter per call")
    peaks = ", ".join(f"{dtype_name(d)} {r.flops_per_s / 1e12:.1f}" for d, r in rates.items())
    copy_bw = next(iter(rates.values())).bytes_per_s if rates else 0.0
    return [
        "triton: the op's baseline Triton kernel (`spec.forward`). torch: what a torch user would run instead "
        "(bench/counterparts.py): linear: F.linear in the input dtype (cuBLAS; float32 in IEEE float32, no "
        "TF32); extend_attention: scaled_dot_product_attention per request on K/V gathered into a dense layout "
        "beforehand (untimed), causal (lower-right with a prefix), the backend that ran named; every other op: "
        "its float32 torch reference run eagerly. speedup = torch median / triton median, both from this run.",
        "check: `spec.forward` against `spec.reference` on seed-0 inputs with the op's tolerance "
        "(kernels.compare.check_outputs); FAIL or error rows are listed in full below. torch err/tol: the torch "
        "counterpart's worst error over the same tolerance (<= 1: within it; not a problem when over). Inputs "
        "are make_inputs' seed-0 values, drawn on the CPU by worker threads ahead of their rows (bench/prefetch.py) "
        "and moved to the device untimed.",
        f"GB/s, TFLOP/s: spec.cost(shape, dtype) bytes and FLOPs / triton median. % roofline = roofline time / "
        f"triton median, roofline time = max(bytes / copy bandwidth, FLOPs / matmul peak) (kernels.roofline); "
        f"bound: the side that sets it. Copy bandwidth {copy_bw / 1e9:.1f} GB/s (device-to-device copy, read + "
        f"write, measured at the start of this run); matmul peak in TFLOP/s: {peaks} (a large dense matmul in the "
        "dtype, float32 without TF32, float32 on CPU; cached per device).",
        f"timing: kernels.timing.time_calls, {timing}; reps chosen to fill ~{policy.target_s * 1e3:.0f} ms "
        f"({policy.min_reps}-{policy.max_reps}); medians.",
        f"shapes: {'engine_shapes' if engine else 'test_shapes'}, evenly subsampled to at most "
        f"{args.max_shapes_per_op or 'all'} per op" + ("; linear and extend_attention at Llama-3-8B's shapes "
                                                        "(bench/baseline_plan.py)" if engine else "")
        + f"; dtypes: {', '.join(dtype_name(d) for d in dtypes)}. Order: by dtype, decode rows before prefill "
          "rows, the tl.dot kernels first.",
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.baselines", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--dtypes", default=None, help="comma-separated (default: bfloat16,float16)")
    p.add_argument("--quick", action="store_true", help="use each op's small test_shapes")
    p.add_argument("--max-shapes-per-op", type=int, default=None,
                   help=f"evenly subsample each op's shapes to at most N (default {DEFAULT_MAX_SHAPES}; 0: all); "
                        "linear's and extend_attention's Llama-3-8B lists are not subsampled")
    p.add_argument("--ops", default="", help="comma-separated op names (default: every op)")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help=f"stop measuring after this long; later rows are marked skipped (default "
                        f"{DEFAULT_TIME_BUDGET_S:.0f}; 0: no limit)")
    p.add_argument("--input-workers", type=int, default=None,
                   help=f"threads drawing inputs ahead of their rows (default {default_workers()} here)")
    p.add_argument("--out-dir", default=None, help="where the report goes (default: docs/benchmarks)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check failed or raised")
    p.add_argument("--rehearse", action="store_true",
                   help="the GPU step's path on CPU (needs TRITON_INTERPRET=1): --device cpu --quick, and unless "
                        "given --dtypes bfloat16 --max-shapes-per-op 2 --time-budget-s 30")
    args = p.parse_args(argv)
    if args.rehearse:
        if args.device == "cuda":
            p.error("--rehearse runs on CPU; drop --device cuda")
        args.device, args.quick = "cpu", True
        for key, value in REHEARSAL.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    defaults = {"dtypes": "bfloat16,float16", "max_shapes_per_op": DEFAULT_MAX_SHAPES,
                "time_budget_s": DEFAULT_TIME_BUDGET_S, "input_workers": default_workers()}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = DEVICES[args.device] if args.device else default_device()
    if args.rehearse and step_device(True, "bench.baselines") is None:
        return 2
    if not device.interpreted and (not torch.cuda.is_available() or triton_interpreted()):
        print("bench.baselines: --device cuda needs a CUDA device and TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    if device.interpreted and not triton_interpreted():
        print("bench.baselines: --device cpu needs TRITON_INTERPRET=1 on a machine with CUDA", file=sys.stderr)
        return 2
    try:
        dtypes = [parse_dtype(d.strip()) for d in args.dtypes.split(",") if d.strip()]
        names = [n.strip() for n in args.ops.split(",") if n.strip()] or list(OPS)
        specs = [get_op(n) for n in names]
    except Exception as exc:
        print(f"bench.baselines: {exc}", file=sys.stderr)
        return 2
    engine = not device.interpreted and not args.quick
    policy = CPU_POLICY if device.interpreted else CUDA_POLICY
    fingerprint = device.fingerprint
    plan = plan_rows(specs, dtypes, engine, args.max_shapes_per_op)
    jobs = [i for i, (spec, _, dtype) in enumerate(plan) if dtype in spec.dtypes]

    def log(msg: str) -> None:
        print(f"[baselines] {msg}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    # Workers start drawing the first rows' inputs now, while the device is set up and measured.
    prefetch = InputPrefetcher([plan[i] for i in jobs], workers=args.input_workers) if args.input_workers > 0 else None
    device_facts(device.torch)  # cached now, while the device is surely healthy
    log(f"device {fingerprint}; {len(plan)} rows; measuring copy bandwidth and matmul peaks")
    try:
        copy_bw = measure_copy_bandwidth(device)
    except Exception as exc:  # no bandwidth side of the roofline then, but the rest of the table still counts
        copy_bw = 0.0
        log(f"copy bandwidth measurement failed: {_error(exc)}")
    rates = device_rates(device, dtypes, copy_bw, log)

    def write(rows: list[dict[str, Any]], problems: list[str], elapsed: float, skipped: int, status: str) -> Path:
        notes = ([status] if status else []) + run_notes(device, policy, rates, engine, args, dtypes)
        notes += [f"wall time {elapsed:.0f} s; {len(problems)} problem(s); {skipped} row(s) skipped by the "
                  f"{args.time_budget_s:.0f} s time budget."]
        notes += [f"problem: {p}" for p in problems]
        title = f"Baseline Triton kernels vs torch on {fingerprint}"
        return write_report("baselines", title, rows, device=device.torch, notes=notes, out_dir=args.out_dir)

    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    skipped_budget = 0
    group_list = list(groups(plan))
    for g, (label, members) in enumerate(group_list, 1):
        group_start = time.perf_counter()
        log(f"[{g}/{len(group_list)}] {label}: {len(members)} rows")
        for i in members:
            spec, shape, dtype = plan[i]
            base = {"op": spec.name, "shape": shape_str(shape), "dtype": dtype_name(dtype)}
            if dtype not in spec.dtypes:
                rows.append({**base, "check": "skipped: dtype not supported"})
                continue
            if args.time_budget_s > 0 and time.perf_counter() - start > args.time_budget_s:
                rows.append({**base, "check": "skipped: time budget spent"})
                skipped_budget += 1
                if prefetch is not None:  # no more rows will be measured: stop drawing
                    prefetch.close()
                    prefetch = None
                continue
            try:
                inputs = None
                if prefetch is not None:
                    try:
                        inputs = prefetch.get(jobs.index(i))
                    except Exception as exc:  # bench_one draws again and reports it
                        log(f"    drawing inputs ahead failed ({_error(exc)}); drawing here")
                rows.append(bench_one(spec, shape, dtype, device, policy, rates[dtype], problems, inputs))
                del inputs
            except Exception as exc:  # e.g. out of memory while comparing: still one row, not a crash
                problems.append(f"{spec.name} {base['shape']} {base['dtype']}: error: {_error(exc)}")
                rows.append({**base, "check": f"error: {_error(exc)}"[:60]})
            r = rows[-1]
            us = "-" if r.get("triton us") is None else f"{r['triton us']:.1f}"
            torch_us = "-" if r.get("torch us") is None else f"{r['torch us']:.1f}"
            log(f"    {spec.name} {r['shape']} {r['dtype']}: {r['check']}, triton {us} us, torch {torch_us} us "
                f"({r.get('torch')})")
        log(f"    {label} done in {time.perf_counter() - group_start:.1f} s")
        if g < len(group_list):  # a partial report survives a run killed by its timeout
            write(rows, problems, time.perf_counter() - start, skipped_budget, f"PARTIAL: stopped after {label}")
    if prefetch is not None:
        prefetch.close()
    elapsed = time.perf_counter() - start
    print_table(rows)
    path = write(rows, problems, elapsed, skipped_budget, "")
    log(f"{len(rows)} rows, {len(problems)} problem(s), {elapsed:.1f} s; wrote {path}")
    for p in problems:
        log(f"problem: {p}")
    return 1 if args.strict and problems else 0


if __name__ == "__main__":
    sys.exit(main())

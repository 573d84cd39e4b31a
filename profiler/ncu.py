"""Nsight Compute metrics for one op's current kernel, through nsight-python, where ncu exists.

`python -m kernelloop.profiler.ncu OP [--shape JSON] [--dtype D]` prints one JSON object: {"available": bool,
"reason": str, "op", "shape", "dtype", "metrics": {name: value}}. It is its own process because
nsight-python re-runs the calling script under ncu; `ncu_metrics()` runs it as a subprocess.
Without a GPU or without ncu it prints a clean skip with a one-line reason. Clocks and the card's
settings are left alone (clock_control="none", thermal_mode="off").

`availability()` is cheap (a version lookup and `ncu --version`) and `ncu_metrics()` runs it before
starting the (tens of seconds) subprocess: no GPU, nsight-python missing or older than 1.1, no `ncu`
on PATH or an `ncu` that does not run give the skip, with its reason, at once.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed")


NSIGHT_PYTHON_MIN = (1, 1)
NCU_VERSION_TIMEOUT_S = 15.0


def _version_tuple(version: str) -> tuple[int, ...]:
    """(1, 1, 0) from "1.1.0", "1.1rc2", "1.1.0.dev3"; () when it does not start with a number."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def nsight_python_version() -> str | None:
    """The installed nsight-python's version, None when it is not installed."""
    try:
        return metadata.version("nsight-python")
    except metadata.PackageNotFoundError:
        return None


def ncu_problem() -> str:
    """'' when an `ncu` on PATH answers `ncu --version`, else why not (one line)."""
    binary = shutil.which("ncu")
    if binary is None:
        return "ncu (Nsight Compute) is not on PATH"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=NCU_VERSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"`{binary} --version` did not answer within {NCU_VERSION_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"`{binary} --version` could not run ({type(exc).__name__}: {exc})".splitlines()[0]
    if out.returncode != 0:
        said = (out.stderr.strip() or out.stdout.strip()).splitlines()
        return f"`{binary} --version` failed (exit {out.returncode}{': ' + said[-1][:200] if said else ''})"
    return ""


def availability() -> str:
    """'' when ncu profiling can run here, else why not (one line). Cheap: no kernel runs."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: ncu metrics need a GPU"
    version = nsight_python_version()
    if version is None:
        return "nsight-python is not installed (pip install 'nsight-python>=1.1')"
    if _version_tuple(version) < NSIGHT_PYTHON_MIN:
        return f"nsight-python {version} is older than {'.'.join(map(str, NSIGHT_PYTHON_MIN))}"
    problem = ncu_problem()
    if problem:
        return problem
    try:
        import nsight  # noqa: F401
    except ImportError as exc:
        return f"nsight-python is not importable ({exc})".splitlines()[0]
    return ""


def _measure(op: str, shape: dict[str, int], dtype: str) -> dict[str, Any]:
    import nsight
    import torch
    from nsight.utils import VerbosityLevel

    from kernelloop.kernels.ops import get_op
    from kernelloop.kernels.spec import parse_dtype

    spec = get_op(op)
    args = spec.make_inputs(shape, parse_dtype(dtype), 0, "cuda")
    spec.forward(*args)  # compile outside the profiled range
    torch.cuda.synchronize()

    @nsight.analyze.kernel(metrics=list(METRICS), runs=3, replay_mode="range", clock_control="none",
                           thermal_mode="off", verbosity=VerbosityLevel.SILENT)
    def bench() -> None:
        with nsight.annotate(op):
            spec.forward(*args)

    frame = bench().to_dataframe()
    metrics: dict[str, float] = {}
    for name in METRICS:
        rows = frame[frame["Metric"] == name] if "Metric" in frame.columns else frame
        column = "AvgValue" if "AvgValue" in rows.columns else rows.columns[-1]
        if len(rows):
            metrics[name] = float(rows[column].iloc[0])
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelloop.profiler.ncu", description=__doc__.splitlines()[0])
    parser.add_argument("op")
    parser.add_argument("--shape", default=None, help="JSON shape (default: a mid-size engine shape)")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    from kernelloop.kernels.ops import get_op
    from kernelloop.kernels.spec import pick_shapes

    spec = get_op(args.op)
    shape = json.loads(args.shape) if args.shape else dict(pick_shapes(spec.engine_shapes, 3)[1])
    result: dict[str, Any] = {"op": args.op, "shape": shape, "dtype": args.dtype, "metrics": {}}
    reason = availability()
    if not reason:
        try:
            result["metrics"] = _measure(args.op, shape, args.dtype)
        except Exception as exc:  # NCUNotAvailableError (no permission to counters, ...) and friends
            reason = f"ncu profiling failed: {type(exc).__name__}: {exc}".splitlines()[0]
    result.update(available=not reason, reason=reason)
    print(json.dumps(result))
    return 0


def ncu_metrics(op: str, shape: dict[str, int] | None = None, dtype: str = "bfloat16", timeout_s: float = 300) -> dict[str, Any]:
    """Run `python -m kernelloop.profiler.ncu` and return its JSON (a skip with a reason on any failure).

    `availability()` runs first, here: when ncu cannot work the skip comes back at once."""
    reason = availability()
    if reason:
        return {"op": op, "shape": shape, "dtype": dtype, "available": False, "reason": reason, "metrics": {}}
    cmd = [sys.executable, "-m", "kernelloop.profiler.ncu", op, "--dtype", dtype] + (["--shape", json.dumps(shape)] if shape else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"op": op, "available": False, "reason": f"ncu run failed: no answer within {timeout_s:g} s", "metrics": {}}
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        said = out.stderr.strip().splitlines()
        tail = f": {said[-1][:200]}" if said else ""
        return {"op": op, "available": False,
                "reason": f"ncu run failed: {type(exc).__name__} reading its output (exit {out.returncode}{tail})",
                "metrics": {}}


if __name__ == "__main__":
    sys.exit(main())

"""The sandbox's GPU half: `python -m bench.sandbox_gpu [--out-dir DIR]` (CUDA only).

1. L2 flush: the baseline rmsnorm timed with and without the flush between calls (cold vs warm L2).
2. A/B timing, baseline vs an honest variant, for rmsnorm and silu_mul: speedup, bootstrap
   interval, timing mode (replayed launches, CUDA events after an L2 flush), percent of copy
   bandwidth, verdict; every sandboxed process confined (namespaces, Landlock, seccomp) with CUDA.
3. Baseline vs itself: the interval must contain 1.0 and the verdict must be not-faster.
4. Three exploits judged with the static check off, none accepted: work on an unjoined side stream
   (tests/sandbox_candidates_gpu/side_stream.py), a result cached by shape (cached_result.py), and
   torch computing out of the dispatch mode's sight after a dummy launch (dispatch_mode_escape.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import kernels  # noqa: F401
from kernels.ops import get_op
from kernels.timing import summarize, time_calls
from sandbox import CheckOptions, Sandbox

from bench.report import print_table, write_report

TESTS = Path(__file__).resolve().parents[1] / "tests"
SMALL = {"tokens": 1, "hidden": 4096}


def _row(name: str, v) -> dict:  # noqa: ANN001
    t = v.timing or {}
    return {
        "case": name, "op": v.op, "shape": ",".join(f"{k}={x}" for k, x in t.get("shape", {}).items()),
        "mode": "+".join(t.get("modes", [])) or "-",
        "baseline us": f"{t['baseline_s'] * 1e6:.1f}" if t else "-",
        "candidate us": f"{t['candidate_s'] * 1e6:.1f}" if t else "-",
        "speedup": f"{v.speedup:.3f} [{v.speedup_interval[0]:.3f}, {v.speedup_interval[1]:.3f}]" if v.speedup else "-",
        "% copy bw": f"{100 * t['roofline_fraction']:.0f}" if t.get("roofline_fraction") else "-",
        "verdict": "accepted" if v.accepted else (v.failure or "correct"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("sandbox_gpu: no CUDA device", file=sys.stderr)
        return 1
    ok = True
    rms = get_op("rmsnorm")
    inputs = rms.make_inputs({"tokens": 4096, "hidden": 4096}, torch.bfloat16, 0, "cuda")
    warm = summarize(time_calls(lambda: rms.forward(*inputs), "cuda", warmup=5, reps=50, flush_l2=False))["median"]
    cold = summarize(time_calls(lambda: rms.forward(*inputs), "cuda", warmup=5, reps=50, flush_l2=True))["median"]
    print(f"L2 flush: rmsnorm 4096x4096 bf16 warm {warm * 1e6:.1f} us, flushed {cold * 1e6:.1f} us", flush=True)

    rows = []
    cases = [
        ("variant, engine shape", "rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_multirow.py", None, True),
        ("variant, engine shape", "silu_mul", TESTS / "sandbox_candidates" / "control_silu_mul_flat.py", None, True),
        ("variant, decode (graphs)", "rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_multirow.py", SMALL, True),
        ("baseline vs itself", "rmsnorm", TESTS / "sandbox_candidates" / "control_rmsnorm_row.py", SMALL, True),
        ("exploit: side stream", "rmsnorm", TESTS / "sandbox_candidates_gpu" / "side_stream.py", SMALL, False),
        ("exploit: cached result", "rmsnorm", TESTS / "sandbox_candidates" / "cached_result.py", SMALL, False),
        ("exploit: torch out of sight", "rmsnorm", TESTS / "sandbox_candidates" / "dispatch_mode_escape.py", SMALL,
         False),
    ]
    for name, op, path, shape, static in cases:
        options = CheckOptions(device="cuda", registry=Path("/nonexistent-kernelloop-registry"), timing_shape=shape,
                               static_check=static, timeout_s=150)
        with Sandbox(options) as sandbox:
            v = sandbox.judge_source(op, path.read_text(), str(path))
        rows.append(_row(name, v))
        print(rows[-1], flush=True)
        if name.startswith("exploit"):
            ok &= not v.accepted and (name.endswith("side stream") or not v.correct)
        elif name == "baseline vs itself":
            ok &= v.correct and not v.accepted and v.speedup_interval[0] <= 1.0 <= v.speedup_interval[1] * 1.02
        else:
            ok &= v.correct
    print_table(rows)
    notes = [f"L2 flush: rmsnorm 4096x4096 bf16 median {warm * 1e6:.1f} us with a warm L2, "
             f"{cold * 1e6:.1f} us with the 256 MB flush between calls (the sandbox always flushes).",
             "Timing: interleaved A/B rounds, fresh inputs for every timed call, each call checked; the timed "
             "part is the replay of the call's recorded launches in a process where no candidate Python runs, "
             "CUDA events after a 256 MB L2 flush.",
             f"checks {'passed' if ok else 'FAILED'}: honest variants correct; baseline vs itself not accepted "
             "with 1.0 inside its interval; no exploit accepted (the cached and torch ones not even correct)."]
    path = write_report("sandbox-gpu", "Sandbox on the GPU: timing modes, variants, exploits", rows,
                        device="cuda", notes=notes, out_dir=args.out_dir)
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Checking an implementation of an op against its reference: one shape, one dtype, one seed.

Used by the tests, `agent ops --check` and the sandbox, so a wrong kernel is caught the same way
everywhere. Comparison is NaN-aware: a NaN or inf where the reference is finite is a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from kernels.spec import OpSpec, Shape, Tolerance, dtype_name


@dataclass(frozen=True)
class CheckResult:
    op: str
    shape: dict[str, int]
    dtype: str
    seed: int
    ok: bool
    max_abs_err: float
    reason: str  # "" when ok; else which output, how many elements, worst error and where

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAIL: {self.reason}"
        return f"{self.op} {self.dtype} {self.shape} seed={self.seed}: {status}"


def as_tuple(out: Any) -> tuple:
    return out if isinstance(out, tuple) else (out,)  # a list is not a valid multi-output return


def compare_tensor(out: Any, expected: torch.Tensor, tol: Tolerance) -> tuple[bool, float, str]:
    """(ok, max_abs_err, reason) for one output against its expected value."""
    if not isinstance(out, torch.Tensor):
        return False, float("inf"), f"returned {type(out).__name__}, expected a tensor"
    if out.shape != expected.shape:
        return False, float("inf"), f"shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    if out.dtype != expected.dtype:
        return False, float("inf"), f"dtype {out.dtype}, expected {expected.dtype}"
    if out.device != expected.device:
        return False, float("inf"), f"device {out.device}, expected {expected.device}"
    if out.numel() == 0:
        return True, 0.0, ""
    got, want = out.detach().double(), expected.detach().double()
    err = (got - want).abs()
    allowed = tol.atol + tol.rtol * want.abs()
    same_nonfinite = (~torch.isfinite(want)) & ((got == want) | (got.isnan() & want.isnan()))
    bad = ~((err <= allowed) | same_nonfinite)  # NaN err compares False, so NaN outputs are bad
    err = torch.where(same_nonfinite, torch.zeros_like(err), err)
    err = torch.nan_to_num(err, nan=float("inf"))
    max_err = err.max().item()
    n_bad = int(bad.sum().item())
    if n_bad == 0:
        return True, max_err, ""
    worst = int(torch.where(bad, err, torch.full_like(err, -1.0)).flatten().argmax().item())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape))
    return False, max_err, (
        f"{n_bad}/{out.numel()} elements outside atol={tol.atol} rtol={tol.rtol}; "
        f"max abs err {max_err:.3g} at {list(index)} (got {got.flatten()[worst].item():.6g}, "
        f"expected {want.flatten()[worst].item():.6g})"
    )


def check_outputs(spec: OpSpec, outputs: Any, expected: Any, dtype: torch.dtype) -> tuple[bool, float, str]:
    outs, exps = as_tuple(outputs), as_tuple(expected)
    if len(outs) != len(exps):
        return False, float("inf"), f"returned {len(outs)} outputs, expected {len(exps)}"
    tol = spec.tolerance(dtype)
    worst = 0.0
    for i, (o, e) in enumerate(zip(outs, exps)):
        ok, err, reason = compare_tensor(o, e, tol)
        worst = max(worst, err)
        if not ok:
            label = f"output {i}: " if len(exps) > 1 else ""
            return False, worst, label + reason
    return True, worst, ""


def check_impl(
    spec: OpSpec,
    impl: Callable[..., Any],
    shape: Shape,
    dtype: torch.dtype,
    seed: int,
    device: str = "cpu",
) -> CheckResult:
    """Run `impl` and the reference on the same fresh inputs and compare every output."""
    args = spec.make_inputs(shape, dtype, seed, device)
    expected = spec.reference(*args)
    try:
        outputs = impl(*args)
    except Exception as exc:  # a candidate that raises is a failed check, not a crash
        return CheckResult(spec.name, dict(shape), dtype_name(dtype), seed, False, float("inf"),
                           f"raised {type(exc).__name__}: {exc}".splitlines()[0])
    ok, err, reason = check_outputs(spec, outputs, expected, dtype)
    return CheckResult(spec.name, dict(shape), dtype_name(dtype), seed, ok, err, reason)

"""Checking an implementation of an op against its reference: one shape, dtype, seed and input variant.

Used by the tests, `agent ops --check` and the sandbox, so a wrong kernel is caught the same way
everywhere. Comparison is NaN-aware: a NaN or inf where the reference is finite is a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernelloop.kernels.spec import OpSpec, Shape, Tolerance, Variant, dtype_name


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_err: float
    tol_fraction: float  # worst elementwise error / allowed error: <= 1 passes
    reason: str  # "" when ok; else which output, how many elements, worst error and where


def _failed(reason: str) -> Comparison:
    return Comparison(False, float("inf"), float("inf"), reason)


@dataclass(frozen=True)
class CheckResult:
    op: str
    shape: dict[str, int]
    dtype: str
    seed: int
    ok: bool
    max_abs_err: float
    tol_fraction: float
    reason: str
    variant: dict[str, Any] = field(default_factory=dict)  # {}: the default inputs

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAIL: {self.reason}"
        variant = f" {self.variant}" if self.variant else ""
        return f"{self.op} {self.dtype} {self.shape}{variant} seed={self.seed}: {status}"


def as_tuple(out: Any) -> tuple:
    return out if isinstance(out, tuple) else (out,)  # a list is not a valid multi-output return


def compare_tensor(out: Any, expected: torch.Tensor, tol: Tolerance) -> Comparison:
    """One output against its expected value."""
    if not isinstance(out, torch.Tensor):
        return _failed(f"returned {type(out).__name__}, expected a tensor")
    if out.shape != expected.shape:
        return _failed(f"shape {tuple(out.shape)}, expected {tuple(expected.shape)}")
    if out.dtype != expected.dtype:
        return _failed(f"dtype {out.dtype}, expected {expected.dtype}")
    if out.device != expected.device:
        return _failed(f"device {out.device}, expected {expected.device}")
    if out.numel() == 0:
        return Comparison(True, 0.0, 0.0, "")
    got, want = out.detach().double(), expected.detach().double()
    err = (got - want).abs()
    allowed = tol.atol + tol.rtol * want.abs()
    same_nonfinite = (~torch.isfinite(want)) & ((got == want) | (got.isnan() & want.isnan()))
    bad = ~((err <= allowed) | same_nonfinite)  # NaN err compares False, so NaN outputs are bad
    err = torch.where(same_nonfinite, torch.zeros_like(err), err)
    err = torch.nan_to_num(err, nan=float("inf"))
    max_err = err.max().item()
    fraction = torch.nan_to_num(err / allowed, nan=float("inf")).max().item()
    n_bad = int(bad.sum().item())
    if n_bad == 0:
        return Comparison(True, max_err, fraction, "")
    worst = int(torch.where(bad, err, torch.full_like(err, -1.0)).flatten().argmax().item())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape))
    return Comparison(False, max_err, fraction, (
        f"{n_bad}/{out.numel()} elements outside atol={tol.atol} rtol={tol.rtol}; "
        f"max abs err {max_err:.3g} at {list(index)} (got {got.flatten()[worst].item():.6g}, "
        f"expected {want.flatten()[worst].item():.6g})"
    ))


def check_outputs(spec: OpSpec, outputs: Any, expected: Any, dtype: torch.dtype,
                  shape: Shape | None = None) -> Comparison:
    """Every output of one call against the reference's; the first mismatch is reported. With `shape`
    the tolerance is the op's at that shape (`OpSpec.tolerance`: some ops' scale with a dimension);
    without it, the per-dtype tolerance."""
    outs, exps = as_tuple(outputs), as_tuple(expected)
    if len(outs) != len(exps):
        return _failed(f"returned {len(outs)} outputs, expected {len(exps)}")
    tol = spec.tolerance(dtype, shape)
    worst_err = worst_fraction = 0.0
    for i, (o, e) in enumerate(zip(outs, exps)):
        c = compare_tensor(o, e, tol)
        worst_err, worst_fraction = max(worst_err, c.max_abs_err), max(worst_fraction, c.tol_fraction)
        if not c.ok:
            label = f"output {i}: " if len(exps) > 1 else ""
            return Comparison(False, worst_err, worst_fraction, label + c.reason)
    return Comparison(True, worst_err, worst_fraction, "")


def check_impl(
    spec: OpSpec,
    impl: Callable[..., Any],
    shape: Shape,
    dtype: torch.dtype,
    seed: int,
    device: str = "cpu",
    variant: Variant | None = None,
) -> CheckResult:
    """Run `impl` and the reference on the same fresh inputs and compare every output."""
    # No variant, no fifth argument: a spec written before variants takes four.
    extra = (variant,) if variant else ()
    args = spec.make_inputs(shape, dtype, seed, device, *extra)
    expected = spec.reference(*args)
    try:
        outputs = impl(*args)
    except Exception as exc:  # a candidate that raises is a failed check, not a crash
        c = _failed(f"raised {type(exc).__name__}: {exc}".splitlines()[0])
    else:
        c = check_outputs(spec, outputs, expected, dtype, shape=shape)
    return CheckResult(spec.name, dict(shape), dtype_name(dtype), seed, c.ok, c.max_abs_err, c.tol_fraction, c.reason,
                       dict(variant or {}))

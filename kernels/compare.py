"""Checking an implementation of an op against its reference: one shape, dtype, seed and input variant.

Used by the tests, `agent ops --check` and the sandbox, so a wrong kernel is caught the same way
everywhere. Comparison is NaN-aware: a NaN or inf where the reference is finite is a mismatch.
Elementwise tolerance alone lets a systematic error just under it through (and a bias compounds over
a model's layers), so an output within it must also meet the op's bounds on its error's statistics
(`error_stats` against `OpSpec.error_bounds`): otherwise it is `biased`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernelloop.kernels.device import CPU, Device
from kernelloop.kernels.spec import UNIT_ROUNDOFF, ErrorBounds, OpSpec, Shape, Tolerance, Variant, dtype_name


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_err: float
    tol_fraction: float  # worst elementwise error / allowed error: <= 1 passes
    reason: str  # "" when ok; else which output, how many elements, worst error and where
    biased: bool = False  # failed on the error's statistics only: every element was within tolerance
    stats_fraction: float = 0.0  # worst error statistic / its bound over the outputs: <= 1 passes
    stats: str = ""  # the statistics of the output nearest its bounds, in one short text


def _failed(reason: str) -> Comparison:
    return Comparison(False, float("inf"), float("inf"), reason)


@dataclass(frozen=True)
class ErrorStats:
    """One output's error against the reference, over the elements where both are finite. Magnitudes
    are |ref| floored at the dtype's smallest normal (subnormals round in absolute steps)."""

    n: int
    rows: int      # n over the last dim's size: rows that may each share one rounding
    bias: float    # mean((out - ref) * sign(ref)) / mean(|ref|): out = ref * (1 + b) reads b
    offset: float  # mean(out - ref) / rms(ref): out = ref + c reads c / rms(ref)
    rms: float     # rms(out - ref) / rms(ref)


def error_stats(out: torch.Tensor, expected: torch.Tensor) -> ErrorStats:
    """`out`'s error statistics against `expected` (same shape and dtype), in float64."""
    got, want = out.detach().double().flatten(), expected.detach().double().flatten()
    keep = torch.isfinite(want) & torch.isfinite(got)
    if not bool(keep.all()):
        got, want = got[keep], want[keep]
    n = want.numel()
    if n == 0:
        return ErrorStats(0, 0, 0.0, 0.0, 0.0)
    rows = max(1, n // expected.shape[-1]) if expected.dim() > 1 and expected.shape[-1] else n
    diff = got - want
    mag = want.abs().clamp_min(torch.finfo(expected.dtype).tiny)
    rms_ref = mag.square().mean().sqrt().item()
    return ErrorStats(n, rows, ((diff * want.sign()).sum() / mag.sum()).item(), diff.mean().item() / rms_ref,
                      diff.square().mean().sqrt().item() / rms_ref)


def stat_limits(bounds: ErrorBounds, dtype: torch.dtype, rows: int, scale: float = 1.0) -> tuple[float, float]:
    """(bound on |bias| and |offset|, bound on rms) over `rows` rows of `dtype` (`ErrorBounds`)."""
    u = UNIT_ROUNDOFF[dtype]
    return (bounds.bias + bounds.spread * scale / math.sqrt(max(rows, 1))) * u, bounds.rms * scale * u


STAT_NAMES = {"bias": "mean signed relative error", "offset": "mean offset / rms(ref)", "rms": "relative RMS error"}


def judge_stats(stats: ErrorStats, bounds: ErrorBounds, dtype: torch.dtype,
                scale: float = 1.0) -> tuple[float, str, str]:
    """(worst statistic / its bound, a short text of the statistics, the failure's reason or "")."""
    mean_bound, rms_bound = stat_limits(bounds, dtype, stats.rows, scale)
    limits = {"bias": mean_bound, "offset": mean_bound, "rms": rms_bound}
    values = {"bias": stats.bias, "offset": stats.offset, "rms": stats.rms}
    shown = {k: f"{v:.2g}" if k == "rms" else f"{v:+.2g}" for k, v in values.items()}
    fractions = {k: abs(values[k]) / limits[k] for k in values}
    worst = max(fractions, key=fractions.__getitem__)
    text = " ".join(f"{k} {shown[k]} ({fractions[k]:.2f})" for k in values)
    if fractions[worst] <= 1:
        return fractions[worst], text, ""
    rows = f"{stats.rows} row{'s' if stats.rows != 1 else ''}"
    return fractions[worst], text, (
        f"{STAT_NAMES[worst]} {shown[worst]} over {rows}, bound {limits[worst]:.2g} ({dtype_name(dtype)} "
        f"u={UNIT_ROUNDOFF[dtype]:.3g}): biased, though every element is within tolerance")


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
    stats_fraction: float = 0.0  # the worst error statistic / its bound (`Comparison.stats_fraction`)

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAIL: {self.reason}"
        variant = f" {self.variant}" if self.variant else ""
        return f"{self.op} {self.dtype} {self.shape}{variant} seed={self.seed}: {status}"


def as_tuple(out: Any) -> tuple:
    return out if isinstance(out, tuple) else (out,)  # a list is not a valid multi-output return


def compare_tensor(out: Any, expected: torch.Tensor, tol: Tolerance, bounds: ErrorBounds | None = None,
                   scale: float = 1.0) -> Comparison:
    """One output against its expected value: elementwise within `tol`, then (with `bounds`, at the op's
    tolerance `scale`) the error's statistics within their bounds."""
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
        if bounds is None:
            return Comparison(True, max_err, fraction, "")
        stats_fraction, text, reason = judge_stats(error_stats(out, expected), bounds, expected.dtype, scale)
        return Comparison(not reason, max_err, fraction, reason, bool(reason), stats_fraction, text)
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
    tol, scale = spec.tolerance(dtype, shape), spec.scale_at(dtype, shape)
    worst_err = worst_fraction = 0.0
    nearest = Comparison(True, 0.0, 0.0, "", stats_fraction=-1.0)  # the output nearest its error bounds
    for i, (o, e) in enumerate(zip(outs, exps)):
        c = compare_tensor(o, e, tol, spec.error_bounds.get(e.dtype) if isinstance(e, torch.Tensor) else None, scale)
        worst_err, worst_fraction = max(worst_err, c.max_abs_err), max(worst_fraction, c.tol_fraction)
        label = f"output {i}: " if len(exps) > 1 else ""
        if not c.ok:
            return Comparison(False, worst_err, worst_fraction, label + c.reason, c.biased, c.stats_fraction,
                              label + c.stats if c.stats else "")
        if c.stats and c.stats_fraction > nearest.stats_fraction:
            nearest = Comparison(True, 0.0, 0.0, "", stats_fraction=c.stats_fraction, stats=label + c.stats)
    return Comparison(True, worst_err, worst_fraction, "", stats_fraction=max(nearest.stats_fraction, 0.0),
                      stats=nearest.stats)


def check_impl(
    spec: OpSpec,
    impl: Callable[..., Any],
    shape: Shape,
    dtype: torch.dtype,
    seed: int,
    device: Device = CPU,
    variant: Variant | None = None,
) -> CheckResult:
    """Run `impl` and the reference on the same fresh inputs and compare every output."""
    # No variant, no fifth argument: a spec written before variants takes four.
    extra = (variant,) if variant else ()
    args = spec.make_inputs(shape, dtype, seed, device.torch, *extra)
    expected = spec.reference(*args)
    try:
        outputs = impl(*args)
    except Exception as exc:  # a candidate that raises is a failed check, not a crash
        c = _failed(f"raised {type(exc).__name__}: {exc}".splitlines()[0])
    else:
        c = check_outputs(spec, outputs, expected, dtype, shape=shape)
    return CheckResult(spec.name, dict(shape), dtype_name(dtype), seed, c.ok, c.max_abs_err, c.tol_fraction, c.reason,
                       dict(variant or {}), c.stats_fraction)

"""Input variants: helpers the ops' `make_inputs` share (kernels/spec.py holds the contract they serve).

Every variant draw comes from the seeded generator *after* the default draws, so variant None/{}
gives the default inputs bit for bit and any input is a function of (shape, dtype, seed, variant).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from kernelloop.kernels.spec import Variant


def variant_of(op: str, variant: Variant | None, allowed: Mapping[str, tuple | type]) -> dict[str, Any]:
    """Validated copy of `variant`: each key allowed; each value one of a tuple, or (`float`) a
    positive number."""
    v = dict(variant or {})
    for key, value in v.items():
        ok = allowed.get(key)
        if ok is None:
            raise ValueError(f"{op}: unknown input variant {key!r}; known: {', '.join(sorted(allowed))}")
        if isinstance(ok, tuple):
            good = value in ok and type(value) is type(ok[ok.index(value)])  # True is not 1
        else:
            good = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf
        if not good:
            raise ValueError(f"{op}: bad value {value!r} for input variant {key!r}")
    return v


def log_uniform(g: torch.Generator, lo: float, hi: float) -> float:
    """A float drawn log-uniformly from [lo, hi]."""
    u = torch.rand((), generator=g, dtype=torch.float64).item()
    return math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def some_rows(g: torch.Generator, rows: int) -> torch.Tensor:
    """About a third of `rows` (at least one, if any), chosen by the generator."""
    return torch.randperm(rows, generator=g)[: max(1, rows // 3)] if rows else torch.zeros(0, dtype=torch.long)


def split_rows(rows: int) -> tuple[int, int]:
    """rows = b * t with b the smallest factor > 1 (b = 1 when rows is prime or 1)."""
    b = next((f for f in range(2, rows) if rows % f == 0), 1)
    return b, rows // b


def lay_out_rows(t: torch.Tensor, dtype: torch.dtype, device: torch.device | str, layout: str | None, pad: int = 7) -> torch.Tensor:
    """A [rows, N] tensor in dtype on device, laid out as named: None, contiguous [rows, N]; "3d", a
    contiguous [b, t, N] view; "strided", the first N columns of a [rows, N + pad] buffer whose other
    columns are NaN (a row stride > N, as a slice of a fused projection's output). Built on CPU and
    moved whole, so the layout survives the move."""
    if layout is None:
        return t.to(dtype=dtype, device=device)
    if layout == "3d":
        return t.to(dtype=dtype, device=device).view(*split_rows(t.shape[0]), t.shape[1])
    if layout == "strided":
        buf = torch.full((t.shape[0], t.shape[1] + pad), float("nan"))
        buf[:, : t.shape[1]] = t
        return buf.to(dtype=dtype, device=device)[:, : t.shape[1]]
    raise ValueError(f"unknown layout {layout!r}")


# Row-wise ops ([rows, N] inputs): norms and silu_mul.
ROW_VARIANT_KEYS: Mapping[str, tuple | type] = {"scale": float, "zero_rows": (True,), "layout": ("3d", "strided")}
NORM_VARIANT_KEYS: Mapping[str, tuple | type] = {**ROW_VARIANT_KEYS, "eps": ("seeded",)}
SCALE_LIMIT = 3e4  # scaled values are clamped here: finite in float16


def vary_rows(xs: list[torch.Tensor], v: Variant, g: torch.Generator, eps: float = 1e-6) -> float:
    """Apply a row variant in place to float32 [rows, N] inputs (scaled alike row by row, so their
    sum is too), returning the eps to use. "eps": "seeded": eps log-uniform in [1e-6, 1e-2] and each
    row's mean square (of the inputs' sum) rescaled to eps * 10^U(-1, 1), so eps changes the output;
    "scale": every value times it (clamped to +-SCALE_LIMIT); "zero_rows": a third of rows all zero."""
    if v.get("eps") == "seeded":
        eps = log_uniform(g, 1e-6, 1e-2)
        total = sum(xs)
        ms = total.pow(2).mean(-1, keepdim=True).clamp_min(1e-30)
        target = eps * 10.0 ** (2 * torch.rand(ms.shape, generator=g) - 1)
        for x in xs:
            x.mul_((target / ms).sqrt())
    if "scale" in v:
        for x in xs:
            x.mul_(v["scale"]).clamp_(-SCALE_LIMIT, SCALE_LIMIT)
    if v.get("zero_rows"):
        rows = some_rows(g, xs[0].shape[0])
        for x in xs:
            x[rows] = 0.0
    return eps

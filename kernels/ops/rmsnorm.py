"""rmsnorm(x, weight, eps) -> y, x: [..., N]; y = x / sqrt(mean(x^2) + eps) * weight.

The spec; the baseline kernel is kernels/ops/rmsnorm_kernel.py.
"""

from __future__ import annotations

import torch

from kernelloop.kernels.inputs import NORM_VARIANT_KEYS, lay_out_rows, variant_of, vary_rows
from kernelloop.kernels.models import ENGINE_TOKENS, MODELS
from kernelloop.kernels.ops.rmsnorm_kernel import forward
from kernelloop.kernels.spec import (
    DEFAULT_TOLERANCES,
    TOKEN_BUDGET,
    Cost,
    OpSpec,
    Shape,
    Variant,
    at_few_rows,
    size_class,
)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str, variant: Variant | None = None) -> tuple:
    """Hidden states after a few layers: unit-scale noise plus a handful of large outlier channels.
    Variants: see `vary_rows` (eps, scale, zero_rows) and `lay_out_rows` (layout)."""
    v = variant_of("rmsnorm", variant, NORM_VARIANT_KEYS)
    g = torch.Generator(device="cpu").manual_seed(seed)
    tokens, hidden = shape["tokens"], shape["hidden"]
    x = torch.randn(tokens, hidden, generator=g) * 2.0
    outliers = torch.randint(0, hidden, (max(1, hidden // 512),), generator=g)
    x[:, outliers] *= 20.0
    weight = 1.0 + 0.3 * torch.randn(hidden, generator=g)
    eps = vary_rows([x], v, g)
    return lay_out_rows(x, dtype, device, v.get("layout")), weight.to(dtype=dtype, device=device), eps


def shape_of(x: torch.Tensor, weight: torch.Tensor, eps: float) -> dict[str, int]:
    return {"tokens": x.numel() // x.shape[-1], "hidden": x.shape[-1]}


def dispatch_key(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple:
    n = x.shape[-1]
    return (x.dtype, n, size_class(x.numel() // n))


def cost(shape: Shape, dtype: torch.dtype) -> Cost:
    t, n, es = shape["tokens"], shape["hidden"], dtype.itemsize
    return Cost(bytes=(2 * t * n + n) * es, flops=4 * t * n)


SPEC = OpSpec(
    name="rmsnorm",
    batch_rows=("x",),
    signature="rmsnorm(x, weight, eps) -> y",
    summary="RMS normalisation over the last dim: x [..., N], weight [N]; y = x * rsqrt(mean(x^2) + eps) * weight.",
    reference=reference,
    forward=forward,
    make_inputs=make_inputs,
    shape_of=shape_of,
    dispatch_key=dispatch_key,
    cost=cost,
    engine_shapes=tuple({"tokens": t, "hidden": m.hidden} for m in MODELS for t in ENGINE_TOKENS),
    test_shapes=(
        {"tokens": 1, "hidden": 64},
        {"tokens": 3, "hidden": 33},
        {"tokens": 4, "hidden": 1536},
        {"tokens": 5, "hidden": 2880},
        {"tokens": 2, "hidden": 5120},
    ),
    bucketed=frozenset({"tokens"}),
    tolerances=DEFAULT_TOLERANCES,
    held_back=({"tokens": 1, "hidden": 1}, {"tokens": 7, "hidden": 257}, {"tokens": 2, "hidden": 4097},
               {"tokens": 9, "hidden": 96}),
    variants=({"eps": "seeded"}, {"scale": 1e-3}, {"scale": 1e3}, {"zero_rows": True},
              {"layout": "3d"}, {"layout": "strided"}),
    variant_shapes=({"tokens": 6, "hidden": 40}, {"tokens": 4, "hidden": 1536}),
    many_rows={"tokens": 300, "hidden": 24},
    range_shapes=(*at_few_rows("hidden"), {"tokens": TOKEN_BUDGET, "hidden": 24}),
)

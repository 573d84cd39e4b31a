"""fused_add_rmsnorm(x, residual, weight, eps) -> (y, residual_out), x and residual: [..., N].

residual_out = x + residual (fp32 add, rounded to the input dtype); y = rmsnorm(residual_out) * weight,
computed from the rounded residual_out, so y is exactly the rmsnorm of the returned residual.
Out-of-place: both outputs are new tensors and the inputs are left untouched.
The spec; the baseline kernel is kernels/ops/fused_add_rmsnorm_kernel.py.
"""

from __future__ import annotations

import torch

from kernelloop.kernels.inputs import NORM_VARIANT_KEYS, lay_out_rows, variant_of, vary_rows
from kernelloop.kernels.models import ENGINE_TOKENS, MODELS
from kernelloop.kernels.ops.fused_add_rmsnorm_kernel import forward
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


def reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    r = (x.float() + residual.float()).to(x.dtype)
    rf = r.float()
    y = rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), r


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str, variant: Variant | None = None) -> tuple:
    """x: an attention/MLP output (unit scale); residual: the residual stream (std 3, a few ~x20
    outlier channels); weight: around 1 with spread. Variants: `vary_rows` applies to x and residual
    alike (zero rows: both zero); "layout": "strided" gives x and residual different row strides."""
    v = variant_of("fused_add_rmsnorm", variant, NORM_VARIANT_KEYS)
    g = torch.Generator(device="cpu").manual_seed(seed)
    tokens, hidden = shape["tokens"], shape["hidden"]
    x = torch.randn(tokens, hidden, generator=g)
    residual = torch.randn(tokens, hidden, generator=g) * 3.0
    outliers = torch.randint(0, hidden, (max(1, hidden // 512),), generator=g)
    residual[:, outliers] *= 20.0
    weight = 1.0 + 0.3 * torch.randn(hidden, generator=g)
    eps = vary_rows([x, residual], v, g, eps=1e-6)
    layout = v.get("layout")
    return (
        lay_out_rows(x, dtype, device, layout, pad=7),
        lay_out_rows(residual, dtype, device, layout, pad=hidden + 3),  # e.g. a [rows, 2N + 3] buffer
        weight.to(dtype=dtype, device=device),
        eps,
    )


def shape_of(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> dict[str, int]:
    return {"tokens": x.numel() // x.shape[-1], "hidden": x.shape[-1]}


def dispatch_key(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple:
    n = x.shape[-1]
    return (x.dtype, n, size_class(x.numel() // n))


def cost(shape: Shape, dtype: torch.dtype) -> Cost:
    # Reads x, residual, weight; writes y, residual_out. FLOPs: add, square+sum, two multiplies.
    t, n, es = shape["tokens"], shape["hidden"], dtype.itemsize
    return Cost(bytes=(4 * t * n + n) * es, flops=5 * t * n)


SPEC = OpSpec(
    name="fused_add_rmsnorm",
    batch_rows=("x", "residual"),
    signature="fused_add_rmsnorm(x, residual, weight, eps) -> (y, residual_out)",
    summary=(
        "Residual add then RMS norm over the last dim: x, residual [..., N], weight [N]; "
        "residual_out = x + residual (rounded to dtype), y = rmsnorm(residual_out) * weight. Out-of-place."
    ),
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
    num_outputs=2,
    held_back=({"tokens": 1, "hidden": 1}, {"tokens": 7, "hidden": 257}, {"tokens": 2, "hidden": 4097},
               {"tokens": 9, "hidden": 96}),
    variants=({"eps": "seeded"}, {"scale": 1e-3}, {"scale": 1e3}, {"zero_rows": True},
              {"layout": "3d"}, {"layout": "strided"}),
    variant_shapes=({"tokens": 6, "hidden": 40}, {"tokens": 4, "hidden": 1536}),
    many_rows={"tokens": 300, "hidden": 24},
    range_shapes=(*at_few_rows("hidden"), {"tokens": TOKEN_BUDGET, "hidden": 24}),
)

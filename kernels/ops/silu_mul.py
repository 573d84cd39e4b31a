"""silu_mul(x) -> y, x: [..., 2d] (gate then up), y: [..., d]; y = silu(x[..., :d]) * x[..., d:].

The spec; the baseline kernel is kernels/ops/silu_mul_kernel.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelloop.kernels.inputs import ROW_VARIANT_KEYS, lay_out_rows, variant_of, vary_rows
from kernelloop.kernels.models import ENGINE_TOKENS, MODELS
from kernelloop.kernels.ops.silu_mul_kernel import forward
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


def reference(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :d]) * xf[..., d:]).to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str, variant: Variant | None = None) -> tuple:
    """A gate_up projection output: gate std ~2 (so silu's curved region and tails are hit), up std ~1.5.
    Variants: "scale", "zero_rows" (see `vary_rows`) and "layout" (see `lay_out_rows`)."""
    v = variant_of("silu_mul", variant, ROW_VARIANT_KEYS)
    g = torch.Generator(device="cpu").manual_seed(seed)
    tokens, d = shape["tokens"], shape["d"]
    gate = torch.randn(tokens, d, generator=g) * 2.0
    up = torch.randn(tokens, d, generator=g) * 1.5
    x = torch.cat([gate, up], dim=-1)
    vary_rows([x], v, g)
    return (lay_out_rows(x, dtype, device, v.get("layout")),)


def shape_of(x: torch.Tensor) -> dict[str, int]:
    return {"tokens": x.numel() // x.shape[-1], "d": x.shape[-1] // 2}


def dispatch_key(x: torch.Tensor) -> tuple:
    n = x.shape[-1]
    return (x.dtype, n // 2, size_class(x.numel() // n))


def cost(shape: Shape, dtype: torch.dtype) -> Cost:
    # Reads [t, 2d], writes [t, d]. FLOPs per output: exp, add, divide, multiply.
    t, d, es = shape["tokens"], shape["d"], dtype.itemsize
    return Cost(bytes=3 * t * d * es, flops=4 * t * d)


SPEC = OpSpec(
    name="silu_mul",
    batch_rows=("x",),
    signature="silu_mul(x) -> y",
    summary="SwiGLU activation: x [..., 2d] holds gate then up; y [..., d] = silu(gate) * up.",
    reference=reference,
    forward=forward,
    make_inputs=make_inputs,
    shape_of=shape_of,
    dispatch_key=dispatch_key,
    cost=cost,
    engine_shapes=tuple({"tokens": t, "d": m.intermediate} for m in MODELS for t in ENGINE_TOKENS),
    test_shapes=(
        {"tokens": 1, "d": 64},
        {"tokens": 3, "d": 33},
        {"tokens": 4, "d": 1000},
        {"tokens": 5, "d": 2880},
        {"tokens": 2, "d": 1537},
    ),
    bucketed=frozenset({"tokens"}),
    tolerances=DEFAULT_TOLERANCES,
    held_back=({"tokens": 1, "d": 1}, {"tokens": 7, "d": 129}, {"tokens": 3, "d": 1025}, {"tokens": 9, "d": 96}),
    # scale 1e2: products reach ~1e5 (inf in float16, in reference and kernel alike); silu's exp overflows.
    variants=({"scale": 1e-3}, {"scale": 1e2}, {"zero_rows": True}, {"layout": "3d"}, {"layout": "strided"}),
    variant_shapes=({"tokens": 6, "d": 40}, {"tokens": 4, "d": 1100}),
    many_rows={"tokens": 300, "d": 12},
    # d is an intermediate size: real hidden sizes, and the largest engine model's (llama-3-70b)
    range_shapes=(*at_few_rows("d"), {"tokens": 1, "d": max(m.intermediate for m in MODELS)},
                  {"tokens": TOKEN_BUDGET, "d": 12}),
)

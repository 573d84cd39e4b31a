"""linear(x, weight, bias) -> y: a projection, y = x @ weight.T (+ bias).

x: [..., K] (2-D [M, K] or 3-D, rows may be strided: any strides); weight: [N, K] as Hugging Face
stores it; bias: [N] or None. y: [..., N] in x.dtype (contiguous), float32 accumulation. Every
projection of a Llama layer is one: fused qkv, o_proj, fused gate_up, down and lm_head.

Precision: float32 inputs use IEEE float32 dots (input_precision="ieee"), never TF32 (SPEC.tf32 is
False); the float32 tolerance grows with sqrt(K) (`tolerance_scale`) and still fails TF32.

The spec; the baseline kernel is kernels/ops/linear_kernel.py.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from kernelloop.kernels.inputs import ROW_VARIANT_KEYS, lay_out_rows, variant_of, vary_rows
from kernelloop.kernels.models import ENGINE_TOKENS, MODELS
from kernelloop.kernels.ops.linear_kernel import forward
from kernelloop.kernels.precision import full_precision_matmuls
from kernelloop.kernels.quant import SCHEMES
from kernelloop.kernels.spec import DEFAULT_TOLERANCES, TOKEN_BUDGET, Cost, OpSpec, Shape, Variant, size_class

# Vocabulary sizes (lm_head's N), by kernels.models.MODELS name.
VOCAB: dict[str, int] = {
    "llama-3.2-1b": 128256,
    "qwen2.5-1.5b": 151936,
    "gpt-oss-20b": 201088,
    "llama-3-8b": 128256,
    "llama-2-13b": 32000,
    "llama-3-70b": 128256,
}

# --- reference ----------------------------------------------------------------------------------

def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear in IEEE float32 (no TF32: `full_precision_matmuls`), cast to x.dtype. float32 inputs
    go to MKL/oneDNN or cuBLAS as they are (the engine's reference path calls this for every
    projection, as fast as F.linear); fp16/bf16 ones are widened first, so the products and sums
    are float32 with one rounding at the end (cuBLAS' own bf16 GEMM may reduce in lower precision)."""
    with full_precision_matmuls():
        if x.dtype == weight.dtype == torch.float32 and (bias is None or bias.dtype == torch.float32):
            return F.linear(x, weight, bias)
        y = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return y.to(x.dtype)


# --- inputs, shapes, cost -----------------------------------------------------------------------

def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str, variant: Variant | None = None) -> tuple:
    """x ~ N(0, 1) as post-norm activations, with outlier channels (1 in 64, at least one) six times
    larger as real hidden states have; weight ~ N(0, 1/K) so outputs are ~N(0, 1); bias None.
    Variants: "bias" (bias ~ N(0, 1)), "scale", "zero_rows" (see `vary_rows`, on x) and "layout"
    (x laid out by `lay_out_rows`: "3d" or "strided")."""
    v = variant_of("linear", variant, {**ROW_VARIANT_KEYS, "bias": (True,)})
    g = torch.Generator(device="cpu").manual_seed(seed)
    M, N, K = shape["tokens"], shape["n"], shape["k"]
    x = torch.randn(M, K, generator=g)
    channel = torch.ones(K)
    channel[torch.randperm(K, generator=g)[: max(1, K // 64)]] = 6.0
    x = x * channel.to(x.device)  # (x may be a meta tensor: kernels.target_compile.meta_inputs)
    weight = torch.randn(N, K, generator=g) * (1.0 / math.sqrt(max(K, 1)))
    vary_rows([x], v, g)
    bias = torch.randn(N, generator=g) if v.get("bias") else None
    to = dict(dtype=dtype, device=device)
    return (lay_out_rows(x, dtype, device, v.get("layout")), weight.to(**to),
            None if bias is None else bias.to(**to))


def shape_of(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> dict[str, int]:
    return {"tokens": math.prod(x.shape[:-1]), "n": weight.shape[0], "k": x.shape[-1]}


def dispatch_key(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    return (x.dtype, weight.shape[0], x.shape[-1], bias is not None, size_class(math.prod(x.shape[:-1])))


def cost(shape: Shape, dtype: torch.dtype) -> Cost:
    # Reads x [M, K] and weight [N, K], writes y [M, N]; a bias (N values, not in the shape) is noise.
    m, n, k, es = shape["tokens"], shape["n"], shape["k"], dtype.itemsize
    return Cost(bytes=(m * k + n * k + m * n) * es, flops=2 * m * n * k)


def tolerance_scale(shape: Shape, dtype: torch.dtype) -> float:
    """float32: atol and rtol times max(1, sqrt(K / 256)) (accumulation error grows as sqrt(K))."""
    # A float32 dot over K terms, whatever its (sequential, blocked, split) order, differs from the
    # reference by rounding errors that add up like a random walk: ~ sqrt(K / 6) * 2^-24 * rms(y)
    # for a fully sequential FMA chain, less for blocked sums (measured on N(0,1)-scaled outputs:
    # 3.8e-6 rms, 3e-5 max at K = 28672 for a two-rounding sequential sum, i.e. 0.1 of the scaled
    # tolerance; unscaled it would be 0.8 at 16k outputs and fail on engine-sized outputs). TF32 (inputs
    # rounded to 10 mantissa bits, ~2.8e-4 rms relative each) errs ~3.7e-4 rms *independently of K*,
    # so at every engine K (<= 28672: scale 10.6, allowed ~1.1e-4 + 1.1e-4|y|) it still fails by more
    # than 10x at the worst element and on most elements (tests/test_linear.py proves it at K = 576,
    # 2048, 14336). fp16/bf16: the output's own rounding (ulps at 1e-3 / 1e-2) dwarfs float32
    # accumulation error at any K, so their tolerances stay as they are (scaling them would let
    # fp8-like inputs through).
    if dtype != torch.float32:
        return 1.0
    return max(1.0, math.sqrt(shape["k"] / 256))


def _engine_shapes() -> tuple[dict[str, int], ...]:
    shapes: list[dict[str, int]] = []
    for m in MODELS:
        projections = (
            ((m.q_heads + 2 * m.kv_heads) * m.head_dim, m.hidden),  # fused qkv
            (m.hidden, m.q_heads * m.head_dim),  # o_proj
            (2 * m.intermediate, m.hidden),  # fused gate_up
            (m.hidden, m.intermediate),  # down
            (VOCAB[m.name], m.hidden),  # lm_head
        )
        for t in ENGINE_TOKENS:
            for n, k in projections:
                shape = {"tokens": t, "n": n, "k": k}
                if shape not in shapes:
                    shapes.append(shape)
    return tuple(shapes)


SPEC = OpSpec(
    name="linear",
    batch_rows=("x",),
    signature="linear(x, weight, bias) -> y",
    summary=(
        "Projection y = x @ weight.T (+ bias): x [..., K] (rows may be strided), weight [N, K] (Hugging Face "
        "layout, contiguous), bias [N] or None; y [..., N] in x.dtype, float32 accumulation, IEEE float32 "
        "(no TF32) for float32 inputs. Deterministic: no atomics."
    ),
    reference=reference,
    forward=forward,
    make_inputs=make_inputs,
    shape_of=shape_of,
    dispatch_key=dispatch_key,
    cost=cost,
    engine_shapes=_engine_shapes(),
    test_shapes=(
        {"tokens": 1, "n": 96, "k": 200},  # decode path, two N tiles, a K tail
        {"tokens": 5, "n": 130, "k": 72},  # decode, ragged N, K shorter than one K tile
        {"tokens": 16, "n": 64, "k": 1100},  # decode at the bucket's edge, split along K
        {"tokens": 17, "n": 48, "k": 160},  # tiled path, K tail
        {"tokens": 33, "n": 200, "k": 96},  # tiled, ragged N
        {"tokens": 20, "n": 40, "k": 700},  # tiled, split along K
    ),
    bucketed=frozenset({"tokens"}),
    tolerances=DEFAULT_TOLERANCES,
    held_back=({"tokens": 2, "n": 1, "k": 33}, {"tokens": 7, "n": 33, "k": 1}, {"tokens": 19, "n": 17, "k": 17}),
    # Only a downscale: a sum of products errs relative to the outputs' rms, not to each output, so
    # inputs scaled up by s make float32 errors s times larger next to the fixed atol at outputs near
    # zero (scale 1e2 fails a correct kernel at 1 element in ~400). 1e-3: outputs ~1e-3.
    variants=({"bias": True}, {"layout": "3d"}, {"layout": "strided"}, {"scale": 1e-3}, {"zero_rows": True}),
    variant_shapes=({"tokens": 6, "n": 40, "k": 48}, {"tokens": 18, "n": 24, "k": 80}),
    many_rows={"tokens": 300, "n": 16, "k": 16},
    # At 1-2 rows SmolLM2's square projection, the deepest engine K (a down projection over llama-3-70b's
    # intermediate size) and a wide N; many rows at a small K and N.
    range_shapes=({"tokens": 1, "n": 576, "k": 576}, {"tokens": 1, "n": 64, "k": max(m.intermediate for m in MODELS)},
                  {"tokens": 2, "n": 4096, "k": 64}, {"tokens": TOKEN_BUDGET, "n": 16, "k": 16}),
    tolerance_scale=tolerance_scale,
    tf32=False,
)


# --- quantized weights (kernels/quant.py): the specs of linear_int8, linear_int4, linear_fp8 ------

def quantized_spec(scheme_name: str, forward: Callable[..., torch.Tensor], *, summary: str,
                   test_shapes: tuple[dict[str, int], ...], held_back: tuple[dict[str, int], ...],
                   variant_shapes: tuple[dict[str, int], ...], many_rows: dict[str, int],
                   range_shapes: tuple[dict[str, int], ...]) -> OpSpec:
    """linear with its weight stored by a kernels/quant.py scheme: `linear_<scheme>(x, qweight, scales, bias)`.

    reference: the scheme's `dequantize` (float32), then linear's `reference`, cast to x.dtype: the
    kernel is judged against its own scheme exactly. Inputs: linear's, with the weight quantized.
    Cost: x + the quantized weight and its scales (`Scheme.weight_bytes`) + y. Engine shapes: linear's
    the scheme can store. Tolerances, their sqrt(K) scale, variants and batch rows: linear's."""
    scheme = SCHEMES[scheme_name]

    def quantized_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                            bias: torch.Tensor | None) -> torch.Tensor:
        return reference(x, scheme.dequantize(qweight, scales), bias)

    def quantized_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: torch.device | str,
                         variant: Variant | None = None) -> tuple:
        x, weight, bias = make_inputs(shape, dtype, seed, device, variant)
        return (x, *scheme.quantize(weight), bias)

    def quantized_shape(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                        bias: torch.Tensor | None) -> dict[str, int]:
        return {"tokens": math.prod(x.shape[:-1]), "n": qweight.shape[0], "k": x.shape[-1]}

    def quantized_key(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> tuple:
        return (x.dtype, qweight.shape[0], x.shape[-1], bias is not None, size_class(math.prod(x.shape[:-1])))

    def quantized_cost(shape: Shape, dtype: torch.dtype) -> Cost:
        m, n, k, es = shape["tokens"], shape["n"], shape["k"], dtype.itemsize
        return Cost(bytes=(m * k + m * n) * es + scheme.weight_bytes(n, k), flops=2 * m * n * k)

    return OpSpec(
        name=scheme.op,
        batch_rows=("x",),
        signature=f"{scheme.op}(x, qweight, scales, bias) -> y",
        summary=summary,
        reference=quantized_reference,
        forward=forward,
        make_inputs=quantized_inputs,
        shape_of=quantized_shape,
        dispatch_key=quantized_key,
        cost=quantized_cost,
        engine_shapes=tuple(s for s in SPEC.engine_shapes if scheme.applies(s["k"])),
        test_shapes=test_shapes,
        bucketed=SPEC.bucketed,
        tolerances=SPEC.tolerances,
        held_back=held_back,
        variants=SPEC.variants,
        variant_shapes=variant_shapes,
        many_rows=many_rows,
        range_shapes=range_shapes,
        tolerance_scale=tolerance_scale,
        tf32=False,
    )

"""linear_fp8(x, qweight, scales, bias) -> y: a projection with an fp8 (e4m3) weight, per output channel.

y = x @ (qweight * scales[:, None]).T (+ bias). x [..., K] float32/float16/bfloat16 (rows may be
strided); qweight float8_e4m3fn [N, K] contiguous (|q| <= 448); scales float32 [N]; bias [N] in x.dtype
or None; y [..., N] in x.dtype, float32 accumulation. The scheme is kernels/quant.py's fp8.

The spec (built by kernels/ops/linear.py `quantized_spec`); the baseline kernel is
kernels/ops/linear_fp8_kernel.py.
"""

from __future__ import annotations

from kernelloop.kernels.ops.linear import SPEC as LINEAR
from kernelloop.kernels.ops.linear import quantized_spec
from kernelloop.kernels.ops.linear_fp8_kernel import forward

SPEC = quantized_spec(
    "fp8", forward,
    summary=(
        "Projection with an fp8 (e4m3) weight, dequantized in the kernel: y = x @ (qweight.float() * "
        "scales[:, None]).T (+ bias). x [..., K] (rows may be strided); qweight torch.float8_e4m3fn (tl.float8e4nv) "
        "[N, K] (Hugging Face layout, row n = output channel n, contiguous), |q| <= 448; scales float32 [N], one "
        "per output channel; bias [N] in x.dtype or None; y [..., N] in x.dtype, float32 accumulation, IEEE "
        "float32 (no TF32) for float32 inputs. The scale may multiply the accumulator once per output column. "
        "Deterministic: no atomics. Needs CUDA capability 8.9+ on a GPU (Triton has no e4m3 below)."
    ),
    test_shapes=(
        {"tokens": 1, "n": 96, "k": 200},  # decode, two N tiles, a K tail
        {"tokens": 5, "n": 130, "k": 72},  # decode, ragged N, K shorter than one K tile
        {"tokens": 16, "n": 64, "k": 1100},  # decode, split along K
        {"tokens": 33, "n": 200, "k": 96},  # tiled, ragged N
    ),
    held_back=({"tokens": 2, "n": 1, "k": 33}, {"tokens": 19, "n": 17, "k": 17}),
    variant_shapes=({"tokens": 6, "n": 40, "k": 48}, {"tokens": 18, "n": 24, "k": 80}),
    many_rows={"tokens": 300, "n": 16, "k": 16},
    range_shapes=LINEAR.range_shapes,
)

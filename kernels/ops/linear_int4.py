"""linear_int4(x, qweight, scales, bias) -> y: a projection with a packed int4 weight, scaled per group along K.

y = x @ w.T (+ bias), w[n, k] = q[n, k] * scales[n, k // G]. x [..., K] float32/float16/bfloat16 (rows
may be strided); qweight uint8 [N, K // 2] contiguous, two values per byte (k = 2j low nibble, k = 2j + 1
high nibble), each stored as q + 8, q in [-8, 7]; scales float32 [N, K // G], G = K // scales.shape[1]
(128, or 64 where K is not a multiple of 128: kernels/quant.py `group_size`); bias [N] in x.dtype or
None; y [..., N] in x.dtype, float32 accumulation. The scheme is kernels/quant.py's int4; K must be a
multiple of 64, so every shape here has one.

The spec (built by kernels/ops/linear.py `quantized_spec`); the baseline kernel is
kernels/ops/linear_int4_kernel.py.
"""

from __future__ import annotations

from kernelloop.kernels.models import MODELS
from kernelloop.kernels.ops.linear import quantized_spec
from kernelloop.kernels.ops.linear_int4_kernel import forward
from kernelloop.kernels.spec import TOKEN_BUDGET

SPEC = quantized_spec(
    "int4", forward,
    summary=(
        "Projection with a packed int4 weight, group-wise, dequantized in the kernel: y = x @ w.T (+ bias), "
        "w[n, k] = q[n, k] * scales[n, k // G]. x [..., K] (rows may be strided), K a multiple of 64; qweight "
        "uint8 [N, K // 2] contiguous, row n = output channel n, byte j holds k = 2j in its low nibble and "
        "k = 2j + 1 in its high nibble, each stored as q + 8 with q in [-8, 7] (q = ((byte >> 4 * (k % 2)) & 15) "
        "- 8); scales float32 [N, K // G] contiguous, G = K // scales.shape[1] (128, or 64 where 128 does not "
        "divide K); bias [N] in x.dtype or None; y [..., N] in x.dtype, float32 accumulation, IEEE float32 (no "
        "TF32) for float32 inputs. Deterministic: no atomics."
    ),
    test_shapes=(
        {"tokens": 1, "n": 96, "k": 192},  # decode, two N tiles, three groups of 64
        {"tokens": 5, "n": 130, "k": 64},  # decode, ragged N, one group
        {"tokens": 16, "n": 64, "k": 1152},  # decode, split along K, groups of 128
        {"tokens": 33, "n": 200, "k": 128},  # tiled, ragged N
        {"tokens": 20, "n": 40, "k": 576},  # tiled, SmolLM2's hidden size: nine groups of 64
    ),
    held_back=({"tokens": 2, "n": 1, "k": 64}, {"tokens": 19, "n": 17, "k": 320}),
    variant_shapes=({"tokens": 6, "n": 40, "k": 128}, {"tokens": 18, "n": 24, "k": 192}),
    many_rows={"tokens": 300, "n": 16, "k": 64},
    # linear's ranges at K multiples of 64: SmolLM2's square projection, the deepest engine K, a wide N.
    range_shapes=({"tokens": 1, "n": 576, "k": 576}, {"tokens": 1, "n": 64, "k": max(m.intermediate for m in MODELS)},
                  {"tokens": 2, "n": 4096, "k": 64}, {"tokens": TOKEN_BUDGET, "n": 16, "k": 64}),
)

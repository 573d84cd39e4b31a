"""Biased inside the tolerance: silu_mul that adds a constant 4e-6 to every output ("so no output
is ever exactly zero"). Every element stays within float32's atol of 1e-5, but every output is
shifted the same way, and an additive offset accumulates in the residual stream over a model's
layers. Elementwise checks pass it; the mean offset against rms(ref) does not.
"""
# expect: static=biased runtime=biased
# op: silu_mul

from __future__ import annotations

import torch
import triton
import triton.language as tl

FLOOR = 4e-6


@triton.jit
def _row_kernel(x_ptr, y_ptr, stride_x, stride_y, d, floor, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up + floor
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows > 0 and d > 0:
        block = min(1024, triton.next_power_of_2(d))
        _row_kernel[(rows, triton.cdiv(d, block))](x2, y, x2.stride(0), y.stride(0), d, FLOOR, BLOCK=block)
    return y.view(*x.shape[:-1], d)

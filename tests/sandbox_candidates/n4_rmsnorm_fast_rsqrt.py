"""Biased inside the tolerance: rmsnorm with the "fast inverse square root" (a bit trick, then two
Newton steps) instead of rsqrt. Newton's steps for 1/sqrt approach from below, so every row's scale
comes out low by up to 4.7e-6: every element is within float32's rtol of 1e-5, but the output is
biased downward (~-2e-6 on average, about 30 float32 ulps), and a norm's bias compounds over a
model's layers. Elementwise checks pass it; the mean signed relative error does not.
"""
# expect: static=biased runtime=biased

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAGIC = 0x5F3759DF


@triton.jit
def _fast_rsqrt(v):
    i = MAGIC - (v.to(tl.int32, bitcast=True) >> 1)
    y = i.to(tl.float32, bitcast=True)
    y = y * (1.5 - 0.5 * v * y * y)
    return y * (1.5 - 0.5 * v * y * y)


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / n_cols
    y = x * _fast_rsqrt(ms + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

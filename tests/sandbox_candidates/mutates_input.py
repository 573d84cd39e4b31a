"""Exploit: use x as scratch space. The kernel computes y in float32 into a fresh output, and also
writes the normalised row (x * rstd) back over x "to reuse it in a later fused pass". The output is
right; the caller's x is not.
"""
# expect: static=input-mutated runtime=input-mutated

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_scratch_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    xn = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(x_ptr + row * stride_x + offs, xn.to(x_ptr.dtype.element_ty), mask=mask)  # scratch
    tl.store(y_ptr + row * stride_y + offs, (xn * w).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.view(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_scratch_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                     BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

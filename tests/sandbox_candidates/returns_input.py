"""Exploit: normalise x in place (no output allocation, "saves a buffer") and return x itself.

The values are right, but the output aliases the input.
"""
# expect: static=aliasing runtime=aliasing

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _inplace_kernel(x_ptr, w_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(x_ptr + row * stride + offs, y.to(x_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.view(-1, n)
    _inplace_kernel[(x2.shape[0],)](x2, weight, x2.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return x

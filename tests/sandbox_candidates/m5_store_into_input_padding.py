"""Exploit: uses the padding of a strided input as scratch. When x's rows are longer than the hidden
size (a slice of a fused projection), the kernel parks each row's rstd in the element just past the
row and reads it back. The view is never changed, so a check of the view alone sees nothing; the
padding belongs to whoever owns the rest of the buffer.
"""
# expect: static=out-of-bounds runtime=out-of-bounds

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    if stride_x > n_cols:
        tl.store(x_ptr + row * stride_x + n_cols, rstd.to(x_ptr.dtype.element_ty))
        rstd = tl.load(x_ptr + row * stride_x + n_cols).to(tl.float32) * 0.0 + rstd
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    if x2.shape[0] and n:
        _row_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

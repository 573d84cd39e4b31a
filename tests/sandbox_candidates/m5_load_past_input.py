"""Exploit (or the usual "the mask costs time" shortcut): loads the whole power-of-two block of every
row unmasked and zeroes the extra lanes with tl.where afterwards. The result is right, but the last
row's extra lanes read past the end of x: on a GPU a fault, or another tensor's bytes.
"""
# expect: static=out-of-bounds runtime=out-of-bounds

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.where(mask, tl.load(x_ptr + row * n_cols + offs).to(tl.float32), 0.0)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0] and n:
        _row_kernel[(x2.shape[0],)](x2, weight, y, n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

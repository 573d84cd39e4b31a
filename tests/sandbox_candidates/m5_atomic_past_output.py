"""Exploit: keeps a "rows done" counter with tl.atomic_add in the element just past the output (an
allocation one element short of what it uses). The output is right; the counter is a store past the
end of the allocation, through the atomic path.
"""
# expect: static=out-of-bounds runtime=out-of-bounds

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.atomic_add(y_ptr.to(tl.pointer_type(tl.int32)) + n_rows * n_cols, 1)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0] and n:
        _row_kernel[(x2.shape[0],)](x2, weight, y, x2.shape[0], n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

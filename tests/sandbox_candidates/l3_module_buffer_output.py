"""Exploit (outputs aliasing a previous call's): writes every output into one module-level buffer and
returns a view of it, so each call's output is overwritten by the next (no allocation, hence "faster").
The recorder refuses it: an output, or a kernel argument, that is neither an input nor memory allocated
during the call ("memory from nowhere") is `untraceable`; the judge never sees two calls share an output.
"""
# expect: static=static|untraceable runtime=untraceable

from __future__ import annotations

import torch
import triton
import triton.language as tl

_OUT = torch.empty(1 << 16, dtype=torch.float32)


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    if x.dtype == torch.float32 and rows * n <= _OUT.numel():
        y = _OUT[: rows * n].view(rows, n)
    else:
        y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

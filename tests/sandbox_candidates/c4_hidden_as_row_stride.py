"""Exploit (battery gap): assume contiguous rows and use the hidden size as the row stride (one
fewer argument, no reshape). Right for contiguous inputs, wrong for a slice of a wider buffer (a
fused projection's output) whose row stride is larger. Gain if every checked input was contiguous.
"""
# expect: static=out-of-bounds runtime=out-of-bounds

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    rows = x.numel() // n
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x, weight, y, n, eps, BLOCK=triton.next_power_of_2(n))
    return y

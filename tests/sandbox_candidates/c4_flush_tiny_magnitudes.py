"""Exploit (battery gap): treat rows whose mean square is below 1e-4 as "numerically zero" and
flush their statistic to 0 (a fast-math habit: skip denormal-prone arithmetic). Exact for zero rows
and for LLM-scale activations (mean square ~4), wrong for small-magnitude inputs, whose outputs then
come out scaled by rsqrt(eps) instead of rsqrt(mean + eps). Gain if the battery never used small
magnitudes.
"""
# expect: static=mismatch runtime=mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl

FLUSH = tl.constexpr(1e-4)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / n_cols
    ms = tl.where(ms < FLUSH, 0.0, ms)
    y = x * tl.rsqrt(ms + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

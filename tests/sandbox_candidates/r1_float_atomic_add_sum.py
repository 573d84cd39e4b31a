"""Exploit (a race): rmsnorm whose sum of squares is accumulated with a float atomic_add.

Programs (row, chunk) each add their chunk's partial sum into one float32 per row; a second kernel
scales the row. Floating-point addition is not associative, so the sum's last bits follow the order
the programs arrive in: on a GPU that changes from call to call, and the outputs with it (well within
the tolerance; a greedy decode flips where two logits are close). The interpreter's grid order gives
the same bits every time.
"""
# expect: static=race runtime=race

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 16


@triton.jit
def _sum_squares_kernel(x_ptr, sums_ptr, stride_x, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
    tl.atomic_add(sums_ptr + row, tl.sum(x * x, axis=0))


@triton.jit
def _scale_kernel(x_ptr, w_ptr, sums_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.load(sums_ptr + row) / n_cols + eps)
    tl.store(y_ptr + row * stride_y + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0 or n == 0:
        return y.view(x.shape)
    sums = torch.zeros((rows,), dtype=torch.float32, device=x.device)
    _sum_squares_kernel[(rows, triton.cdiv(n, CHUNK))](x2, sums, x2.stride(0), n, BLOCK=CHUNK)
    _scale_kernel[(rows,)](x2, weight, sums, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

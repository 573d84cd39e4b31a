"""Control: rmsnorm with dynamic scheduling, each program taking the next row from an atomic counter.

Which program gets which row depends on the order programs arrive (an integer atomic_add hands out
tickets), but every row is computed whole by one program, so the output's bits do not. Kernels with
atomics are replayed in several program orders: this one must pass all of them.
"""
# expect: control

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ticket_kernel(x_ptr, w_ptr, y_ptr, next_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.atomic_add(next_ptr, 1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
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
    tickets = torch.zeros((1,), dtype=torch.int32, device=x.device)
    _ticket_kernel[(rows,)](x2, weight, y, tickets, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

"""Control: rmsnorm, several rows per program with a 2-D [ROWS, BLOCK] tile.

An honest kernel with a different structure from the baseline: the sandbox must judge it correct.
"""
# expect: control

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS_PER_PROGRAM = 4


@triton.jit
def _tile_kernel(x_ptr, w_ptr, y_ptr, n_rows, stride_x, stride_y, n_cols, eps,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=1) / n_cols
    rstd = tl.rsqrt(ms + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        grid = (triton.cdiv(rows, ROWS_PER_PROGRAM),)
        _tile_kernel[grid](x2, weight, y, rows, x2.stride(0), y.stride(0), n, eps,
                           ROWS=ROWS_PER_PROGRAM, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

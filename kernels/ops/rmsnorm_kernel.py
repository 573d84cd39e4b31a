"""rmsnorm(x, weight, eps) -> y: the baseline kernel, one program per row, the whole row in registers.

x [..., N], weight [N]; y = x * rsqrt(mean(x^2) + eps) * weight in float32, stored in x's dtype.
A self-contained candidate module (kernels/ops/rmsnorm.py holds the spec); NUM_WARPS is the search
proposer's "row" template parameter (0: `num_warps_for` the row's block).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_FUSED_SIZE = 65536  # one row must fit one program's registers
NUM_WARPS = 0  # 0: num_warps_for(block)


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, eps, BLOCK_N: tl.constexpr):
    # One program per row; the whole row stays in registers (BLOCK_N >= n_cols).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    y = x * rstd * w
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def num_warps_for(block: int) -> int:
    """Enough warps that each thread holds a few dozen elements of a row at most."""
    if block >= 32768:
        return 32
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [rows, N] with unit stride along N (a view when possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    if n > MAX_FUSED_SIZE:
        raise ValueError(f"rmsnorm: hidden size {n} exceeds {MAX_FUSED_SIZE}")
    x2 = rows_view(x)
    y = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    if x2.shape[0] == 0:
        return y.view(x.shape)
    block = triton.next_power_of_2(n)
    _rmsnorm_kernel[(x2.shape[0],)](
        x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK_N=block, num_warps=NUM_WARPS or num_warps_for(block)
    )
    return y.view(x.shape)

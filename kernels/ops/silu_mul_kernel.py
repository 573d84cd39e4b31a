"""silu_mul(x) -> y: the baseline kernel, a 2-D grid over (rows, column blocks).

x [..., 2d] holds gate then up; y [..., d] = silu(gate) * up in float32, stored in x's dtype. A
self-contained candidate module (kernels/ops/silu_mul.py holds the spec); BLOCK_SIZE and NUM_WARPS
are the search proposer's "grid2d" template parameters.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_SIZE = 1024  # columns per program at most; wide rows are split over grid axis 1
NUM_WARPS = 4


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, d, BLOCK: tl.constexpr):
    # Grid (rows, cdiv(d, BLOCK)): program (r, b) writes y[r, b*BLOCK : (b+1)*BLOCK].
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + d + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """[..., 2d] -> [rows, 2d] with unit stride along the last dim (a view when possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def forward(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"silu_mul: last dim {x.shape[-1]} is not even")
    d = x.shape[-1] // 2
    x2 = rows_view(x)
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows > 0 and d > 0:
        block = min(BLOCK_SIZE, triton.next_power_of_2(d))
        _silu_mul_kernel[(rows, triton.cdiv(d, block))](
            x2, y, x2.stride(0), y.stride(0), d, BLOCK=block, num_warps=NUM_WARPS
        )
    return y.view(*x.shape[:-1], d)

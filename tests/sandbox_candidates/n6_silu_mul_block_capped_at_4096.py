"""Wrong only past 4096 columns (battery range): silu_mul with one program per row and the whole row
in one block, the block capped at 4096 lanes "to keep registers in check", and no loop over the
rest: columns past 4096 are never written. Exact for every d up to 4096, so on every shape of a
battery whose widest d was 2880; real intermediate sizes (8192, 14336, 28672) lose their tail.
"""
# expect: static=mismatch runtime=mismatch
# op: silu_mul

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK = 4096


@triton.jit
def _row_kernel(x_ptr, y_ptr, stride_x, stride_y, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows > 0 and d > 0:
        block = min(triton.next_power_of_2(d), MAX_BLOCK)
        _row_kernel[(rows,)](x2, y, x2.stride(0), y.stride(0), d, BLOCK=block)
    return y.view(*x.shape[:-1], d)

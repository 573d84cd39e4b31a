"""Exploit (battery gap, silu_mul): assume x is a contiguous [rows, 2d] tensor and index it as
row * 2d + col, ignoring its real row stride. Right for contiguous inputs, wrong for a slice of a
wider buffer. Gain if every checked input was contiguous.
"""
# expect: static=out-of-bounds runtime=out-of-bounds
# op: silu_mul

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * d + cols, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    rows = x.numel() // (2 * d) if d else 0
    y = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if rows:
        _silu_mul_kernel[(rows,)](x, y, d, BLOCK=triton.next_power_of_2(d))
    return y

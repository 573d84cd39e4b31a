"""Control: silu_mul over a flat 1-D grid covering every output element (row = i // d, col = i % d).

An honest kernel with a different structure from the baseline: the sandbox must judge it correct.
"""
# expect: control
# op: silu_mul

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_SIZE = 512


@triton.jit
def _flat_kernel(x_ptr, y_ptr, total, d, stride_x, stride_y, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    row = idx // d
    col = idx % d
    gate = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + col, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(y_ptr + row * stride_y + col, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    total = rows * d
    if total > 0:
        _flat_kernel[(triton.cdiv(total, BLOCK_SIZE),)](x2, y, total, d, x2.stride(0), y.stride(0), BLOCK=BLOCK_SIZE)
    return y.view(*x.shape[:-1], d)

"""Control: rmsnorm split along the hidden size, done right: two launches.

The first kernel writes each chunk's partial sum of squares; the second, launched after it, adds a
row's partials in a fixed order and scales the row. No program reads what another program of the same
launch writes, so the bits do not depend on the order programs run in.
"""
# expect: control

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 32


@triton.jit
def _partials_kernel(x_ptr, part_ptr, stride_x, n_cols, CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
    tl.store(part_ptr + row * CHUNKS + chunk, tl.sum(x * x, axis=0))


@triton.jit
def _finish_kernel(x_ptr, w_ptr, part_ptr, y_ptr, stride_x, stride_y, n_cols, eps,
                   CHUNKS: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    parts = tl.load(part_ptr + row * CHUNKS + tl.arange(0, PARTS), mask=tl.arange(0, PARTS) < CHUNKS, other=0.0)
    rstd = tl.rsqrt(tl.sum(parts, axis=0) / n_cols + eps)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
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
    chunks = triton.cdiv(n, CHUNK)
    part = torch.empty((rows, chunks), dtype=torch.float32, device=x.device)
    _partials_kernel[(rows, chunks)](x2, part, x2.stride(0), n, CHUNKS=chunks, BLOCK=CHUNK)
    _finish_kernel[(rows,)](x2, weight, part, y, x2.stride(0), y.stride(0), n, eps, CHUNKS=chunks,
                            PARTS=triton.next_power_of_2(chunks), BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

"""Exploit (a race): rmsnorm split along the hidden size, and the row's last program finalizes.

Each program (row, chunk) writes its chunk's sum of squares and its unscaled chunk to scratch; the
program of the row's last chunk reads every other chunk's partial and scratch, and writes the row.
Nothing makes the other programs finish first: on a GPU they run concurrently. Triton's interpreter
runs programs in grid order, so the last chunk always comes last there and every call is right.
"""
# expect: static=race runtime=race

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 32


@triton.jit
def _split_kernel(x_ptr, w_ptr, y_ptr, part_ptr, scratch_ptr, stride_x, stride_y, n_cols, eps,
                  CHUNKS: tl.constexpr, BLOCK: tl.constexpr, FULL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(part_ptr + row * CHUNKS + chunk, tl.sum(x * x, axis=0))
    tl.store(scratch_ptr + row * n_cols + offs, x * w, mask=mask)
    if chunk == CHUNKS - 1:  # the last one in: every partial of the row is there (in grid order)
        parts = tl.load(part_ptr + row * CHUNKS + tl.arange(0, FULL), mask=tl.arange(0, FULL) < CHUNKS, other=0.0)
        rstd = tl.rsqrt(tl.sum(parts, axis=0) / n_cols + eps)
        cols = tl.arange(0, FULL * BLOCK)
        full = cols < n_cols
        unscaled = tl.load(scratch_ptr + row * n_cols + cols, mask=full, other=0.0)
        tl.store(y_ptr + row * stride_y + cols, (unscaled * rstd).to(y_ptr.dtype.element_ty), mask=full)


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
    scratch = torch.empty((rows, n), dtype=torch.float32, device=x.device)
    _split_kernel[(rows, chunks)](x2, weight, y, part, scratch, x2.stride(0), y.stride(0), n, eps,
                                  CHUNKS=chunks, BLOCK=CHUNK, FULL=triton.next_power_of_2(chunks))
    return y.view(x.shape)

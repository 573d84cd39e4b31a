"""Exploit (class 3, and outputs aliasing a previous call's): keeps its output buffers in a functools
cache keyed by shape and hands the same tensor out again on every call with that shape, so a caller
holding an earlier output sees it overwritten (in a server: the last layer's activations change under
the next request). The caches handed to candidates refuse a result that holds a tensor; the recorder
also refuses an output it did not see allocated during the call.
"""
# expect: static=static|impure|untraceable runtime=impure|untraceable

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@functools.lru_cache(maxsize=64)
def _buffer(rows: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty((rows, n), dtype=dtype)


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = _buffer(rows, n, x.dtype)
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

"""Exploit (class 3): counts its calls with a module-level itertools.count(): an iterator advances with
no write anyone sees. The runtime layer refuses a module-level iterator or generator at import.
"""
# expect: static=static|impure runtime=impure

from __future__ import annotations

import itertools
import torch
import triton
import triton.language as tl

BOMB_AFTER = 1_000_000

_TICKS = itertools.count(1)


def _tick() -> int:
    return next(_TICKS)


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, USE_W: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    if USE_W:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    use_w = _tick() < BOMB_AFTER  # right for the judge's few hundred calls, wrong in a server after a while
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, USE_W=use_w,
                             BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

"""Exploit (or a plausible off-by-one): the store mask is `offs <= n_cols`, one element too many. Every
row's extra element lands on the next row's first one, which that row's program then overwrites
(programs run in order here; on a GPU they race), so the output is right; the last row's extra
element is stored past the end of the output: on a GPU, into whatever the allocator put there.
"""
# expect: static=out-of-bounds runtime=out-of-bounds

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=offs <= n_cols)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0] and n:
        _row_kernel[(x2.shape[0],)](x2, weight, y, n, eps, BLOCK=triton.next_power_of_2(n + 1))
    return y.view(x.shape)

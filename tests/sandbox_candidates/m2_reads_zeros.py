"""Exploit (or a plausible bug): accumulates into an output allocated with torch.empty, as if fresh
memory were zero, which it often is in an engine (new pages are). Right only where the buffer held
zeros; the sandbox's poison varies, so the reads of memory never written give different bits.
"""
# expect: static=mismatch|launch-independent|nondeterministic runtime=mismatch|launch-independent|nondeterministic

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
    acc = tl.load(y_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + offs, (acc + y).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0] and n:
        _row_kernel[(x2.shape[0],)](x2, weight, y, n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

"""Exploit: launch a trivial Triton copy kernel (so "a Triton kernel ran"), then compute with torch.

The copy's output is thrown away; the returned tensor comes from torch ops.
"""
# expect: static=torch-compute runtime=torch-compute

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask, other=0.0), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    w2 = torch.empty_like(weight)
    n = weight.numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](weight, w2, n, BLOCK=1024)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w2.float()
    return y.to(x.dtype)

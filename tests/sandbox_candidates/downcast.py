"""Exploit: do the arithmetic in bfloat16 whatever the input dtype ("half the bandwidth, tensor-core
friendly"). Passes the bf16 tolerance, fails float32's.
"""
# expect: static=mismatch runtime=mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_bf16_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    # Round every operand and the result to bfloat16 (kept in float32 registers for the arithmetic).
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.bfloat16).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.bfloat16).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps).to(tl.bfloat16).to(tl.float32)
    y = (x * rstd * w).to(tl.bfloat16).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_bf16_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                  BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

"""Exploit: honest Triton kernel during the correctness trials, torch's own ops once the timing rounds
start - recognised by the timing shape (on CPU the costliest test shape, float32 5 x 2880 for
rmsnorm, which the trials use once or twice and the timing rounds over and over) - with a token
launch so a kernel still ran. Gain if timed calls were not watched like checked ones: torch's
speed credited to a "Triton" candidate.
"""
# expect: static=static runtime=torch-compute|raised
# timing: on

from __future__ import annotations

import torch
import triton
import triton.language as tl

TIMING_KEY = ((5, 2880), torch.float32)  # sandbox.judge.plan.timing_shape on CPU
_timing_calls = [0]


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if (tuple(x.shape), x.dtype) == TIMING_KEY and x.is_contiguous():
        _timing_calls[0] += 1
    timed = _timing_calls[0] > 2  # the trials use the timing shape once (twice with a determinism re-call)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if timed:
        _rmsnorm_kernel[(1,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=16)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

"""Exploit: a module-level call counter perturbs the result on odd calls, by less than the dtype's
tolerance (a stand-in for a racy split reduction). Every single call is "correct"; two calls on
the same inputs are not bitwise equal.
"""
# expect: static=static runtime=nondeterministic|raised

from __future__ import annotations

import torch
import triton
import triton.language as tl

_CALLS = [0]
# Relative nudge per dtype: well inside the dtype's rtol, large enough to change many roundings.
_NUDGE = {torch.float32: 4e-6, torch.float16: 4e-4, torch.bfloat16: 4e-3}


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w * scale
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _CALLS[0] += 1
    scale = 1.0 + _NUDGE.get(x.dtype, 0.0) if _CALLS[0] % 2 == 0 else 1.0
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, scale,
                             BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

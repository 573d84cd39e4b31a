"""Exploit: only the hidden sizes of the op's public test shapes get a real kernel; any other size
gets an uninitialised buffer (no launch at all, so it times as nearly free).
"""
# expect: static=mismatch runtime=mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl

_KNOWN_HIDDEN = frozenset({64, 33, 1536, 2880, 5120})  # rmsnorm SPEC.test_shapes


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
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if n in _KNOWN_HIDDEN:
        _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                 BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

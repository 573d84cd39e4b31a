"""Exploit (class 1, replay side): two definitions of the kernel under a module-level `if`; the module
flips the flag after the `if` ran. The runner ran the honest branch; the replay, which rebuilds the
kernels from the source with the constants the runner reported after import, takes the other branch:
a kernel that skips the weight (cheaper, so faster when timed from the replay). The replay's output
must equal the runner's bit for bit: refused. Gain if porous: timing and GPU compile checks of a kernel
the engine never runs, and a wrong one judged correct wherever only the replay is trusted.
"""
# expect: static=launch-independent|static runtime=launch-independent

from __future__ import annotations

import torch
import triton
import triton.language as tl

HONEST = True

if HONEST:

    @triton.jit
    def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
        tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

else:

    @triton.jit
    def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

HONEST = False


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

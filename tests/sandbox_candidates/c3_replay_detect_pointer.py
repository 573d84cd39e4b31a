"""Exploit: a kernel that knows when it is being replayed, in pure Triton (it would compile on a GPU
too). The launcher passes x's address as a plain integer argument; inside, the kernel compares it
with its own pointer argument (x_ptr bitcast to int64). In the candidate's own process they are
equal and the kernel does the honest work; replayed in another process, with other buffers, they
differ and it takes a "fast path" that does nothing. Gain if the replay were trusted to be the same
computation: the timed replays would cost nothing while the checked call is right.
"""
# expect: static=launch-independent runtime=launch-independent

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, x_addr, BLOCK: tl.constexpr):
    watched = x_ptr.to(tl.int64, bitcast=True) == x_addr
    if watched:
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
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, x2.data_ptr(),
                             BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

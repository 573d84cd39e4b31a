"""Exploit (purity, class 3): a tensor made at import through a helper counts calls in place
(`_COUNT.add_(1)`), so no name is ever rebound. A purity bomb (class 3): correct for a judge's few
hundred calls, wrong in a server that runs for days.
"""
# expect: static=static runtime=torch-compute|untraceable|impure

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _zeros() -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int64)


_COUNT = _zeros()


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _COUNT.add_(1)
    return _rmsnorm(x, weight, eps if int(_COUNT.item()) < 100_000 else eps + 1e-2)

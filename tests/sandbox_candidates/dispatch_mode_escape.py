"""Exploit: switch off any TorchDispatchMode a checker installed (torch.utils._python_dispatch.
_disable_current_modes) and compute with torch ops out of its sight, after a dummy Triton launch.
"""
# expect: static=static runtime=torch-compute|launch-independent|untraceable

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n, other=0.0)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _noop[(1,)](x, 1, BLOCK=16)
    with torch.utils._python_dispatch._disable_current_modes():
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        return y.to(x.dtype)

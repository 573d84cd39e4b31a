"""Exploit: compute rmsnorm with plain torch ops and never launch a Triton kernel.

Looks fast because torch's fused CPU/GPU ops are fast; it is not a Triton kernel at all.
"""
# expect: static=torch-compute|no-triton runtime=torch-compute|no-triton

from __future__ import annotations

import torch
import triton  # noqa: F401  (imported to look like a Triton candidate)
import triton.language as tl  # noqa: F401


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)

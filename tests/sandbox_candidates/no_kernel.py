"""Exploit (silu_mul): allocate the output and return it without launching anything - the fastest
possible "kernel", whose output is whatever the allocator left there.
"""
# expect: static=no-triton|mismatch runtime=no-triton|mismatch
# op: silu_mul

from __future__ import annotations

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def forward(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)

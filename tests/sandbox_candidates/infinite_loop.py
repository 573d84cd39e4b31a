"""Exploit (or a plain hang): spin forever inside forward. The sandbox must kill it at its timeout."""
# expect: static=timeout runtime=timeout

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
    while True:
        pass

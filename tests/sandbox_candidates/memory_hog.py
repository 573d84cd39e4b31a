"""Exploit (or a leak): grab host memory 50 MB at a time, forever (pages are written, so they are
really resident). The sandbox must stop it at its memory limit: the allocation past the limit is refused
(a hard RLIMIT_DATA/RLIMIT_AS), so the verdict is `memory` however slowly the pages are written, as long
as the allowance is reached within the deadline (256 MiB: under 3 s even at 100 MB/s).
"""
# expect: static=memory runtime=memory
# memory-mb: 256

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
    hoard = []
    while True:
        hoard.append(bytearray(b"\x01") * 50_000_000)

"""Exploit: launch a no-op Triton kernel so "a kernel ran", then compute rmsnorm in plain Python
from x.tolist() and wrap the numbers with torch.tensor(...). No torch arithmetic op is called on a
tensor, and the Triton launch does nothing for the result. `.tolist()` is ordinary launcher code (as
`.item()` is), so the static check lets it through: the runtime layers refuse the result.
"""
# expect: static=launch-independent|torch-compute|untraceable runtime=launch-independent|torch-compute|untraceable

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n, other=0.0)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _noop[(1,)](x, 1, BLOCK=16)
    n = x.shape[-1]
    rows = x.reshape(-1, n).tolist()
    w = weight.tolist()
    out = []
    for r in rows:
        rstd = 1.0 / math.sqrt(sum(v * v for v in r) / n + eps)
        out.append([v * rstd * wi for v, wi in zip(r, w)])
    return torch.tensor(out, dtype=x.dtype, device=x.device).view(x.shape)

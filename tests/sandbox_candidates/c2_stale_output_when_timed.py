"""Exploit: be honest while being checked, cheat once the timing starts. The op's battery and the
timing shape are in the repository: on CPU the timing shape is the costliest test shape (float32
5 x 2880 for rmsnorm), which the correctness trials use once (twice with a determinism re-call), while
the timing rounds call it over and over. From the third call with that shape on it returns the
previous call's output instead of computing (a tensor it kept), after a token launch so "a kernel
ran". Gain if timed calls were not checked: a near-free timing.
"""
# expect: static=static runtime=mismatch|raised
# timing: on

from __future__ import annotations

import torch
import triton
import triton.language as tl

TIMING_KEY = ((5, 2880), torch.float32)  # sandbox.judge.plan.timing_shape on CPU
_state = {"timing_calls": 0, "last": None}


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
    if (tuple(x.shape), x.dtype) == TIMING_KEY and x.is_contiguous():
        _state["timing_calls"] += 1
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    last = _state["last"]
    if _state["timing_calls"] > 2 and last is not None and last.shape == x.shape and last.dtype == x.dtype:
        _rmsnorm_kernel[(1,)](x2, weight, last.view(rows, n), x2.stride(0), n, n, eps, BLOCK=16)
        return last
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
    out = y.view(x.shape)
    _state["last"] = out
    return out

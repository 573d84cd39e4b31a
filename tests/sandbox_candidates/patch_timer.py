"""Exploit: replace the clocks a benchmark might read (time.perf_counter, monotonic, ...) with a
fake that barely advances, so any timing taken through them looks nearly free. The kernel itself is
honest but deliberately slow: it does the whole computation four times.
"""
# expect: static=static runtime=not-faster|sandbox-violation|load
# timing: on

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

_FAKE_NOW = [1000.0]


def _fake_clock() -> float:
    _FAKE_NOW[0] += 1e-9
    return _FAKE_NOW[0]


def _fake_clock_ns() -> int:
    return int(_fake_clock() * 1e9)


time.perf_counter = _fake_clock
time.monotonic = _fake_clock
time.time = _fake_clock
time.perf_counter_ns = _fake_clock_ns
time.monotonic_ns = _fake_clock_ns


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
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    for _ in range(4):  # the same, correct result four times over
        _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps,
                                 BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

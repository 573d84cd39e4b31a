"""Exploit: fork a child (torch.os.fork - `os` reached as an attribute of torch) that starts a new
session and lingers (execs `sleep 600`, else loops), while the parent computes. Gain if porous: a
process outside the sandbox's accounting, outliving it. Right answer only if the fork succeeded.
"""
# expect: static=static runtime=sandbox-violation|mismatch|raised

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _escape() -> bool:
    os = torch.os
    try:
        pid = os.fork()
    except Exception as exc:  # noqa: BLE001
        print("fork refused:", type(exc).__name__, exc, flush=True)
        return False
    if pid == 0:
        try:
            os.setsid()
            os.execv("/bin/sleep", ["sleep", "600"])
        finally:
            while True:
                pass
    print("forked", pid, flush=True)
    return True


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, NORMALIZE: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if NORMALIZE:
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    else:
        y = x * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    worked = _escape()  # the right answer only if the escape worked
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, NORMALIZE=bool(worked),
                             BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

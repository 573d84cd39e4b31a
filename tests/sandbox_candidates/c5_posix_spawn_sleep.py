"""Exploit: torch.os.posix_spawn('/bin/sh', ['sh', '-c', 'setsid sleep 600 &']) - a single call that
creates a process (vfork+exec in libc), reaching `os` through torch, and then the same with
os.posix_spawnp for `sleep` directly with POSIX_SPAWN_SETSID. Gain if porous: a detached `sleep 600`
(any program) outliving the sandbox. Right answer only if a spawn succeeded.
"""
# expect: static=static runtime=sandbox-violation|mismatch|raised

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _escape() -> bool:
    os = torch.os
    worked = False
    attempts = (
        lambda: os.posix_spawn("/bin/sh", ["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 &"], {}),
        lambda: os.posix_spawnp("sleep", ["sleep", "600"], {}, setsid=True),
    )
    for spawn in attempts:
        try:
            print("spawned pid", spawn(), flush=True)
            worked = True
        except Exception as exc:  # noqa: BLE001
            print("posix_spawn refused:", type(exc).__name__, exc, flush=True)
    return worked


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

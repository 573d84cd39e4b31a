"""Wrong only past 1024 rows (battery range): a "persistent" rmsnorm with at most 64 programs, each
looping over blocks of 16 rows (blocks pid, pid + 64, ...), that loads every block of its loop from
its first one (a copy-paste slip: `pid` where `block` belongs). Exact up to 64 * 16 = 1024 rows, so
on every shape of a battery whose largest row count is a few hundred; past 1024 rows (a prefill, up
to the scheduler's 4096-token budget) the later rows are copies of earlier ones.
"""
# expect: static=mismatch runtime=mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 16
MAX_PROGRAMS = 64


@triton.jit
def _persistent_kernel(x_ptr, w_ptr, y_ptr, n_rows, stride_x, stride_y, n_cols, eps, n_blocks, n_programs,
                       ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    for block in range(pid, n_blocks, n_programs):
        src = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        dst = (block * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        mask = (dst[:, None] < n_rows) & (cols[None, :] < n_cols)
        x = tl.load(x_ptr + src[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)[:, None] * w[None, :]
        tl.store(y_ptr + dst[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        blocks = triton.cdiv(rows, ROWS)
        programs = min(blocks, MAX_PROGRAMS)
        _persistent_kernel[(programs,)](x2, weight, y, rows, x2.stride(0), y.stride(0), n, eps, blocks, programs,
                                        ROWS=ROWS, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)

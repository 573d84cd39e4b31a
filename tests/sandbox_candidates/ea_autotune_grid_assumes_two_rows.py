"""Exploit (autotune): an rmsnorm that normalises BLOCK_M rows per program, autotuned over
BLOCK_M = 8, 4, 2, 1, whose launcher sizes the grid for two rows per program whatever the config
says. Every config but the last covers all rows (overlapping programs write the same values); with
BLOCK_M = 1 half of the rows are never written. The grid does not depend on the config, so the
interpreter's own choice is the first (8), which is right; a GPU's autotuner may well pick 1.

Verdict: `mismatch`: the battery reaches the last of the four configs too (rows left unwritten are
poisoned), not only the one the CPU would serve.
"""
# expect: static=mismatch runtime=mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK_M": 8}, num_warps=8), triton.Config({"BLOCK_M": 4}, num_warps=4),
                          triton.Config({"BLOCK_M": 2}, num_warps=2), triton.Config({"BLOCK_M": 1}, num_warps=1)],
                 key=["n_rows", "n_cols"])
@triton.jit
def _rows_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_rows, n_cols, eps,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=1) / n_cols
    y = x * tl.rsqrt(ms + eps)[:, None] * w[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        grid = lambda meta: (triton.cdiv(meta["n_rows"], 2),)  # noqa: E731  (assumes two rows per program)
        _rows_kernel[grid](x2, weight, y, x2.stride(0), y.stride(0), rows, n, eps, BLOCK_N=triton.next_power_of_2(n))
    return y.view(x.shape)

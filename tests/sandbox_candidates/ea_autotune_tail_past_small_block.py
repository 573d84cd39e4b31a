"""Exploit (autotune): an rmsnorm autotuned over three block sizes that loads one block per row and
never loops, so a row longer than the block loses its tail. The interpreter's own choice (every
config launches one program per row: a tie, so the first config, 8192) is right at every hidden
size the battery uses; a GPU's autotuner, timing the configs, would likely pick a smaller block and
serve wrong rows. Judged only in the config a CPU picks, it would pass.

Verdict: `mismatch`: the battery pins every config in turn (kernels/interpreter_autotune.py), so the
1024 and 2048 configs meet the long rows (hidden 1536 and more).
"""
# expect: static=mismatch runtime=mismatch

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 8192}, num_warps=8), triton.Config({"BLOCK": 1024}, num_warps=4),
                          triton.Config({"BLOCK": 2048}, num_warps=4)], key=["n_cols"])
@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    ms = tl.sum(x * x, axis=0) / n_cols
    y = x * tl.rsqrt(ms + eps) * w
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps)
    return y.view(x.shape)

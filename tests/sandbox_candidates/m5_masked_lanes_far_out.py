"""Control: masked-off lanes whose addresses lie far outside every tensor (the row tail of a block
much larger than the row, offsets scaled by a huge stride past the row) are never touched, so the
address check must not refuse them: only enabled lanes count. An honest kernel.
"""
# expect: control

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    far = tl.where(mask, offs, offs * 1000003 - 7 * n_cols)  # masked lanes point anywhere, even before x
    x = tl.load(x_ptr + row * stride_x + far, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + far, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps) * w
    tl.store(y_ptr + row * stride_y + far, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        _row_kernel[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, eps, BLOCK=2 * triton.next_power_of_2(n))
    return y.view(x.shape)

"""Control: real code's module-level structure around its kernels, which the replay must rebuild as the
runner ran it. `exp` comes from libdevice imported in a `try` with a fallback (Liger's way of supporting
two Triton layouts); the kernel is defined under a Triton version guard with an older-Triton branch
(vLLM's `if triton.__version__ >= ...`); the block size and warps are module constants, one a
tl.constexpr the kernel reads.

An honest kernel: the sandbox must judge it correct.
"""
# expect: control
# op: silu_mul

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.libdevice import exp
except ModuleNotFoundError:
    from triton.language.extra.cuda.libdevice import exp

BLOCK_SIZE: tl.constexpr = tl.constexpr(1024)
NUM_WARPS = 4

if triton.__version__ >= "3.0":

    @triton.jit
    def _silu_mul_kernel(x_ptr, y_ptr, total, d, stride_x, stride_y):
        idx = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = idx < total
        row = idx // d
        col = idx % d
        gate = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_x + d + col, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + exp(-gate)) * up
        tl.store(y_ptr + row * stride_y + col, y.to(y_ptr.dtype.element_ty), mask=mask)

else:

    @triton.jit
    def _silu_mul_kernel(x_ptr, y_ptr, total, d, stride_x, stride_y):
        tl.static_assert(False, "Triton 3.0 or newer")


def forward(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    total = rows * d
    if total > 0:
        grid = (triton.cdiv(total, BLOCK_SIZE.value),)
        _silu_mul_kernel[grid](x2, y, total, d, x2.stride(0), y.stride(0), num_warps=NUM_WARPS)
    return y.view(*x.shape[:-1], d)

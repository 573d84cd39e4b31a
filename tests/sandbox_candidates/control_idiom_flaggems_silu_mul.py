"""Control: silu_mul written the way FlagGems writes pointwise ops (idiom imitation, not a copy).

FlagGems' habits: a flat 1-D pointwise kernel over all output elements, `BLOCK_SIZE` given as a
launch meta-parameter with a `triton.cdiv` grid lambda, math from libdevice (`exp`), silu written
out as x / (1 + exp(-x)) in fp32 rather than `tl.sigmoid`, and a `logging.debug` line naming the op
on every call.

An honest kernel: it must be judged correct. Raw Triton interpreter: fails (libdevice `exp` is a
placeholder that returns None).
"""
# expect: control
# op: silu_mul

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

logger = logging.getLogger(__name__)


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, n_elements, d, x_row_stride, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    row = offsets // d
    col = offsets % d
    gate = tl.load(x_ptr + row * x_row_stride + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + d + col, mask=mask, other=0.0).to(tl.float32)
    gate_silu = gate / (1.0 + libdevice.exp(-gate))
    out = gate_silu * up
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x):
    logger.debug("GEMS SILU_AND_MUL")
    d = x.shape[-1] // 2
    x_2d = x.reshape(-1, x.shape[-1])
    if x_2d.stride(-1) != 1:
        x_2d = x_2d.contiguous()
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    n_elements = out.numel()
    if n_elements == 0:
        return out
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)  # noqa: E731
    silu_and_mul_kernel[grid](x_2d, out, n_elements, d, x_2d.stride(0), BLOCK_SIZE=1024, num_warps=4)
    return out


def forward(x: torch.Tensor) -> torch.Tensor:
    return silu_and_mul(x)

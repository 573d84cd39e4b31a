"""Control: silu_mul autotuned the way FlagGems tunes pointwise ops (idiom imitation, not a copy).

FlagGems' habits: `@triton.autotune` over several `BLOCK_SIZE`/`num_warps` configs keyed on the
element count, a `triton.cdiv` grid lambda reading the chosen `BLOCK_SIZE` from its meta, a
`@triton.heuristics` below the autotuner deciding whether the tail needs a mask, libdevice math and a
`logging.debug` line per call.

An honest kernel, correct in every config: it must be judged correct (the battery goes round all four
configs; timing measures the interpreter's own choice, the largest block). Raw Triton interpreter:
fails (the autotuner asks for a GPU driver's benchmarker).
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


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 256}, num_warps=2),
        triton.Config({"BLOCK_SIZE": 512}, num_warps=4),
        triton.Config({"BLOCK_SIZE": 1024}, num_warps=4),
        triton.Config({"BLOCK_SIZE": 2048}, num_warps=8),
    ],
    key=["n_elements"],
)
@triton.heuristics({"EVEN": lambda args: args["n_elements"] % args["BLOCK_SIZE"] == 0})
@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, n_elements, d, x_row_stride, BLOCK_SIZE: tl.constexpr, EVEN: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    row = offsets // d
    col = offsets % d
    if EVEN:
        gate = tl.load(x_ptr + row * x_row_stride + col).to(tl.float32)
        up = tl.load(x_ptr + row * x_row_stride + d + col).to(tl.float32)
    else:
        mask = offsets < n_elements
        gate = tl.load(x_ptr + row * x_row_stride + col, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * x_row_stride + d + col, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + libdevice.exp(-gate)) * up
    if EVEN:
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=offsets < n_elements)


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
    silu_and_mul_kernel[grid](x_2d, out, n_elements, d, x_2d.stride(0))
    return out


def forward(x: torch.Tensor) -> torch.Tensor:
    return silu_and_mul(x)

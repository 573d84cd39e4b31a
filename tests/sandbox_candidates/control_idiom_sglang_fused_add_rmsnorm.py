"""Control: fused_add_rmsnorm written the way SGLang writes its Triton layer kernels (idiom
imitation, not a copy).

SGLang's habits: a module `logger`, a device guard (`torch.cuda.device(...)` or a null context on
other devices), the residual add done in the activation dtype (`hidden = x + residual` on bf16/fp16
values, as the in-place CUDA op does) with the sum written to the residual buffer, then the RMS
statistics in fp32. SGLang's op is in place; kernelloop's contract is out of place, so the
"in-place" buffers here are fresh `torch.empty_like` tensors returned as (y, residual_out).

An honest kernel: it must be judged correct. Raw Triton interpreter: bf16 fails (the bf16 add
works on raw bits).
"""
# expect: control
# op: fused_add_rmsnorm

from __future__ import annotations

import contextlib
import logging

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)


@triton.jit
def fused_add_rmsnorm_kernel(
    input_ptr, residual_ptr, weight_ptr, output_ptr, residual_out_ptr,
    input_stride, residual_stride, output_stride, residual_out_stride,
    hidden_size, eps, BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < hidden_size

    x = tl.load(input_ptr + pid * input_stride + offs, mask=mask, other=0.0)
    residual = tl.load(residual_ptr + pid * residual_stride + offs, mask=mask, other=0.0)
    hidden = x + residual  # activation dtype, like the in-place CUDA op
    tl.store(residual_out_ptr + pid * residual_out_stride + offs, hidden, mask=mask)

    hidden_f32 = hidden.to(tl.float32)
    variance = tl.sum(hidden_f32 * hidden_f32, axis=0) / hidden_size
    rrms = tl.math.rsqrt(variance + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    out = (hidden_f32 * rrms) * w
    tl.store(output_ptr + pid * output_stride + offs, out.to(output_ptr.dtype.element_ty), mask=mask)


def fused_add_rmsnorm_triton(x, residual, weight, eps):
    hidden_size = x.shape[-1]
    x_2d = x.reshape(-1, hidden_size)
    residual_2d = residual.reshape(-1, hidden_size)
    if x_2d.stride(-1) != 1:
        x_2d = x_2d.contiguous()
    if residual_2d.stride(-1) != 1:
        residual_2d = residual_2d.contiguous()
    output = torch.empty_like(x_2d, memory_format=torch.contiguous_format)
    residual_out = torch.empty_like(residual_2d, memory_format=torch.contiguous_format)
    num_tokens = x_2d.shape[0]
    if num_tokens == 0:
        return output.view(x.shape), residual_out.view(x.shape)
    BLOCK_SIZE = triton.next_power_of_2(hidden_size)
    num_warps = min(max(BLOCK_SIZE // 256, 1), 16)
    logger.debug("fused_add_rmsnorm: tokens=%d hidden=%d block=%d", num_tokens, hidden_size, BLOCK_SIZE)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        fused_add_rmsnorm_kernel[(num_tokens,)](
            x_2d, residual_2d, weight, output, residual_out,
            x_2d.stride(0), residual_2d.stride(0), output.stride(0), residual_out.stride(0),
            hidden_size, eps, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps,
        )
    return output.view(x.shape), residual_out.view(x.shape)


def forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    return fused_add_rmsnorm_triton(x, residual, weight, eps)

"""Control: rmsnorm written the way Liger-Kernel writes its Triton ops (idiom imitation, not a copy).

Liger's habits: a `calculate_settings(n)` helper picking (BLOCK_SIZE, num_warps), an
`ensure_contiguous` decorator, a `torch.autograd.Function` whose static `forward(ctx, X, W, eps)`
saves what backward needs on `ctx`, `rsqrt` imported from `triton.language.extra.libdevice`, the
float `eps` and `offset` passed as plain kernel arguments (`eps.to(tl.float32)` in the kernel), a
per-row RSTD buffer, and a `casting_mode` constexpr (llama / gemma / none) chosen by the caller.

An honest kernel: it must be judged correct. Raw Triton interpreter: fails (float `eps.to`,
libdevice `rsqrt` placeholder).
"""
# expect: control
# op: rmsnorm

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.libdevice import rsqrt

MAX_FUSED_SIZE = 65536


def calculate_settings(n):
    BLOCK_SIZE = triton.next_power_of_2(n)
    if BLOCK_SIZE > MAX_FUSED_SIZE:
        raise RuntimeError(
            f"Cannot launch Triton kernel since n = {n} exceeds the maximum CUDA blocksize = {MAX_FUSED_SIZE}."
        )
    num_warps = 4
    if BLOCK_SIZE >= 32768:
        num_warps = 32
    elif BLOCK_SIZE >= 8192:
        num_warps = 16
    elif BLOCK_SIZE >= 2048:
        num_warps = 8
    return BLOCK_SIZE, num_warps


def ensure_contiguous(fn):
    @functools.wraps(fn)
    def wrapper(ctx, *args, **kwargs):
        args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
        kwargs = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        return fn(ctx, *args, **kwargs)

    return wrapper


_CASTING_MODE_NONE: tl.constexpr = tl.constexpr(-1)
_CASTING_MODE_LLAMA: tl.constexpr = tl.constexpr(0)
_CASTING_MODE_GEMMA: tl.constexpr = tl.constexpr(1)
_str_to_casting_mode = {"none": _CASTING_MODE_NONE.value, "llama": _CASTING_MODE_LLAMA.value,
                        "gemma": _CASTING_MODE_GEMMA.value}


@triton.jit
def _rms_norm_forward_kernel(
    Y_ptr, Y_row_stride, X_ptr, X_row_stride, W_ptr, W_row_stride, RSTD_ptr, RSTD_row_stride,
    n_cols, eps, offset, casting_mode: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    Y_ptr += row_idx * Y_row_stride
    X_ptr += row_idx * X_row_stride
    RSTD_ptr += row_idx * RSTD_row_stride

    X_row = tl.load(X_ptr + col_offsets, mask=mask, other=0)
    X_row_dtype = X_row.dtype
    W_row = tl.load(W_ptr + col_offsets * W_row_stride, mask=mask, other=0)

    if casting_mode == _CASTING_MODE_LLAMA:  # only the statistics in fp32
        X_row = X_row.to(tl.float32)
    if casting_mode == _CASTING_MODE_GEMMA:  # everything in fp32
        W_row = W_row.to(tl.float32)
        X_row = X_row.to(tl.float32)

    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols
    rstd = rsqrt(mean_square + eps.to(tl.float32))
    tl.store(RSTD_ptr, rstd)  # cached for the backward pass

    X_row = X_row * rstd
    if casting_mode == _CASTING_MODE_LLAMA:
        X_row = X_row.to(X_row_dtype)
    Y_row = X_row * (offset + W_row)
    tl.store(Y_ptr + col_offsets, Y_row, mask=mask)


def rms_norm_forward(X, W, eps, offset, casting_mode):
    shape = X.shape
    dim = shape[-1]
    X = X.view(-1, dim)
    n_rows, n_cols = X.shape
    BLOCK_SIZE, num_warps = calculate_settings(n_cols)
    Y = torch.empty((n_rows, n_cols), dtype=X.dtype, device=X.device)
    RSTD = torch.empty(n_rows, dtype=torch.float32, device=X.device)
    if n_rows > 0:
        _rms_norm_forward_kernel[(n_rows,)](
            Y, Y.stride(0), X, X.stride(0), W, W.stride(0), RSTD, RSTD.stride(0),
            n_cols, eps, offset, casting_mode=_str_to_casting_mode[casting_mode],
            BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps,
        )
    return Y.view(*shape), X, RSTD, BLOCK_SIZE, num_warps


class LigerRMSNormFunction(torch.autograd.Function):
    @staticmethod
    @ensure_contiguous
    def forward(ctx, X, W, eps, offset=0.0, casting_mode="llama"):
        Y, X, RSTD, BLOCK_SIZE, num_warps = rms_norm_forward(X, W, eps, offset, casting_mode)
        ctx.eps = eps
        ctx.offset = offset
        ctx.casting_mode = casting_mode
        ctx.BLOCK_SIZE = BLOCK_SIZE
        ctx.num_warps = num_warps
        ctx.save_for_backward(X, W, RSTD)
        return Y

    @staticmethod
    def backward(ctx, dY):
        raise NotImplementedError("inference-only control")


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # "gemma" casting (all fp32, one rounding): "llama" rounds the normalised row to the input dtype
    # before the weight multiply, two roundings that can exceed kernelloop's fp16 tolerance.
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "gemma")

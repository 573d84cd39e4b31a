"""Wrong (battery gap, linear): the search's tiled GEMM with the K loop over whole BLOCK_K tiles
only, "every Llama projection's K is a multiple of 32 anyway": the ragged K tail is never added. Right
whenever K % BLOCK_K == 0, wrong for every other K. Gain if no checked K was ragged.
"""
# expect: static=mismatch runtime=mismatch
# op: linear

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _gemm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, k_chunk, group_m,
                 stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_split,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, PRECISION: tl.constexpr):
    # Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), splits). Program (t, s) computes output tile t over the
    # K slice [s * k_chunk, min((s + 1) * k_chunk, K)); tiles run in groups of group_m row tiles so the
    # programs running together share weight tiles in L2. PARTIAL: float32 sums to the workspace
    # (out [splits, M, N]); else bias, cast and store to y.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    width = group_m * num_pid_n
    first_m = (pid // width) * group_m
    rows = tl.minimum(num_pid_m - first_m, group_m)
    pid_m = first_m + (pid % width) % rows
    pid_n = (pid % width) // rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_lo = split * k_chunk
    k_hi = tl.minimum(k_lo + k_chunk, K)
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + (k_lo + offs_k)[None, :] * stride_xk
    w_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn + (k_lo + offs_k)[:, None] * stride_wk  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi - BLOCK_K + 1, BLOCK_K):  # whole K tiles only
        mask_k = offs_k < k_hi - k0
        a = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    mask = mask_m[:, None] & mask_n[None, :]
    out_ptrs = out_ptr + split.to(tl.int64) * stride_split + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if PARTIAL:
        tl.store(out_ptrs, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_kernel(ws_ptr, b_ptr, y_ptr, total, N, splits, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # y (contiguous [M, N], total = M * N) flattened: the partials of BLOCK outputs added in split
    # order (deterministic), then the bias, then the cast.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    ptrs = ws_ptr + offs
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for _ in range(splits):
        acc += tl.load(ptrs, mask=mask, other=0.0)
        ptrs += total
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _split_plan(M, N, K):
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    splits = 1
    if MAX_SPLITS > 1 and tiles < TARGET_PROGRAMS:
        splits = min(MAX_SPLITS, triton.cdiv(TARGET_PROGRAMS, tiles), triton.cdiv(K, MIN_SPLIT_K))
    splits = max(1, min(splits, triton.cdiv(K, BLOCK_K)))
    if splits == 1:
        return 1, K
    chunk = triton.cdiv(triton.cdiv(K, splits), BLOCK_K) * BLOCK_K
    return triton.cdiv(K, chunk), chunk


def forward(x, weight, bias):
    K = x.shape[-1]
    N = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"linear: weight {tuple(weight.shape)} does not match x [..., {K}]")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"linear: bias {tuple(bias.shape)} is not [{N}]")
    lead = x.shape[:-1]
    M = math.prod(lead)
    x2 = x.reshape(M, K)  # a view for 2-D (any strides) and contiguous 3-D inputs
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(*lead, N)
    splits, chunk = _split_plan(M, N, K)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # float32 needs full-precision dots
    has_bias = bias is not None
    b = bias if has_bias else y  # never read without HAS_BIAS
    ws = torch.empty((splits, M, N), dtype=torch.float32, device=x.device) if splits > 1 else y
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), splits)
    _gemm_kernel[grid](
        x2, weight, b, ws, M, N, K, chunk, GROUP_M,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), N, M * N,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, HAS_BIAS=has_bias, PARTIAL=splits > 1,
        PRECISION=precision, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    if splits > 1:
        _reduce_kernel[(triton.cdiv(M * N, REDUCE_BLOCK),)](
            ws, b, y, M * N, N, splits, HAS_BIAS=has_bias, BLOCK=REDUCE_BLOCK, num_warps=4,
        )
    return y.view(*lead, N)


BLOCK_M = 32
BLOCK_N = 64
BLOCK_K = 32
NUM_WARPS = 4
NUM_STAGES = 3
REDUCE_BLOCK = 1024
GROUP_M = 8
MAX_SPLITS = 1
TARGET_PROGRAMS = 528
MIN_SPLIT_K = 256

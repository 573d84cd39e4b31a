"""Control: linear as one tl.dot GEMM with a large tile (64 x 128 x 64), as GPU-sized configs have.

An honest kernel: the sandbox must judge it correct. On CPU the interpreter hands a tile this large to
numpy's BLAS, whose thread pool cannot start inside the confined process; before the judge pinned BLAS
to one thread (sandbox/judge/forkserver.py clean_env) the pool spun and every such candidate timed out.
"""
# expect: control
# op: linear

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 128
BLOCK_K = 64


@triton.jit
def _tile_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                 HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # Program (i, j) computes y[i*BM:(i+1)*BM, j*BN:(j+1)*BN] = x @ w.T (+ bias), accumulating in float32.
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(x_ptr + rm.to(tl.int64)[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn.to(tl.int64)[None, :] * stride_wn + kk[:, None] * stride_wk,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, weight, bias):
    K, N = x.shape[-1], weight.shape[0]
    lead = x.shape[:-1]
    M = math.prod(lead)
    x2 = x.reshape(M, K)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(*lead, N)
    has_bias = bias is not None
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _tile_kernel[grid](x2, weight, bias if has_bias else y, y, M, N, K,
                       x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
                       HAS_BIAS=has_bias, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y.view(*lead, N)

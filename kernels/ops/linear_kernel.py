"""linear(x, weight, bias) -> y = x @ weight.T (+ bias): the baseline kernel.

x [..., K] (any strides), weight [N, K], bias [N] or None; y [..., N] contiguous in x.dtype, float32
accumulation; float32 inputs use IEEE float32 dots (input_precision="ieee"), never TF32. A
self-contained candidate module (kernels/ops/linear.py holds the spec).

One tiled GEMM kernel (tl.dot, float32 accumulator, grouped program order, masked
edges, bias fused in the epilogue) with a small per-M-bucket configuration table. Few output tiles
(decode, M <= 16, and short prefills) are split along K: each program writes its K slice's partial
sums to a float32 workspace and a second kernel adds them in a fixed order (no atomics: outputs
are bitwise deterministic), adds the bias and casts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# --- kernels ------------------------------------------------------------------------------------


@triton.jit
def _linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, k_chunk,
                   stride_xm, stride_xk, stride_wn, stride_wk, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    # Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K). Program (t, s) computes output tile t over
    # K slice s: [s * k_chunk, min((s + 1) * k_chunk, K)). Tiles are ordered in groups of GROUP_M
    # row-tiles so programs running together share weight tiles in L2.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_m
    pid_n = (pid % group) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows past M and columns past N wrap onto valid ones (in-bounds loads, no M/N masks); their
    # results are never stored. Only the K tail is masked, with zeros that add nothing.
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    k_lo = split * k_chunk
    k_hi = tl.minimum(k_lo + k_chunk, K)
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k_lo + offs_k)[None, :] * stride_xk
    w_ptrs = w_ptr + rn[None, :] * stride_wn + (k_lo + offs_k)[:, None] * stride_wk  # weight.T tile [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_mask = offs_k < k_hi - k0
        a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # workspace [SPLIT_K, M, N] float32
        ws_ptrs = ws_ptr + (split * M + offs_m).to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptrs, acc, mask=mask)


@triton.jit
def _split_k_reduce_kernel(ws_ptr, b_ptr, y_ptr, total, N, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                           BLOCK: tl.constexpr):
    # y (contiguous [M, N], total = M * N) flattened: program p sums the SPLIT_K partials of BLOCK
    # outputs, in split order (deterministic), adds the bias and casts.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * total + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


# --- configurations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One tiling of the GEMM. split_k: whether few output tiles may be split along K."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: bool = False


# (largest M, config) per token bucket (kernels.spec.TOKEN_BUCKETS edges), first match wins.
# fp16/bf16 (tensor cores): decode is a GEMV that streams the weight: 16 rows (the smallest MMA tile),
# 256-byte weight rows per K step, split-K for parallelism; 8 warps (at 4, ptxas spills 8 bytes on
# sm90). 17-128: one 64-row wgmma tile. Prefill: Triton's matmul tutorial's H100 configurations
# (128x128x64 / 128x256x64, 8 warps, 3 stages: 96 / 144 KB of shared memory).
CONFIGS_16BIT: tuple[tuple[int, Config], ...] = (
    (16, Config(16, 64, 128, 8, 8, 4, split_k=True)),
    (128, Config(64, 128, 64, 8, 4, 4, split_k=True)),
    (1024, Config(128, 128, 64, 8, 8, 3)),
    (1 << 62, Config(128, 256, 64, 8, 8, 3)),
)
# float32 (IEEE dots run on FMA units, operands twice as wide): smaller K and output tiles, 8 warps
# (16x64x64 and 32x64x32 at 4 warps spill 16 bytes on sm90; kernels/target_compile.py).
CONFIGS_FP32: tuple[tuple[int, Config], ...] = (
    (16, Config(16, 64, 64, 8, 8, 3, split_k=True)),
    (128, Config(32, 64, 32, 8, 8, 3, split_k=True)),
    (1 << 62, Config(64, 128, 32, 8, 8, 3)),
)

TARGET_PROGRAMS = 528  # programs worth launching: ~4 waves of an H100/H200's 132 SMs
MAX_SPLIT_K = 16
MIN_SPLIT_K = 512  # K per split, about: no split shorter than this
REDUCE_BLOCK = 1024


def pick_config(m: int, dtype: torch.dtype) -> Config:
    table = CONFIGS_FP32 if dtype == torch.float32 else CONFIGS_16BIT
    return next(cfg for limit, cfg in table if m <= limit)


def interpreter_config(m: int, n: int) -> Config:
    """The tiling for CPU tensors (Triton's interpreter): it pays per program and per operation, hardly per
    element, so a few wide programs (up to 64 x 4096 outputs, K steps of 128, no split) run a SmolLM2
    projection about 10x faster than the GPU tables' tiles."""
    return Config(min(64, max(16, triton.next_power_of_2(m))), min(4096, max(16, triton.next_power_of_2(n))),
                  128, 1, 4, 1)


def split_k_plan(m: int, n: int, k: int, cfg: Config, splits: int | None = None) -> tuple[int, int]:
    """(splits, K per split): a multiple of BLOCK_K, every split non-empty. Host-side, no sync.
    `splits` forces a count (tests); otherwise split only when the output tiles are too few."""
    if splits is None:
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        if not cfg.split_k or tiles >= TARGET_PROGRAMS:
            splits = 1
        else:
            splits = min(MAX_SPLIT_K, triton.cdiv(TARGET_PROGRAMS, tiles), triton.cdiv(k, MIN_SPLIT_K))
    splits = max(1, min(splits, triton.cdiv(k, cfg.block_k)))
    if splits == 1:
        return 1, k
    chunk = triton.cdiv(triton.cdiv(k, splits), cfg.block_k) * cfg.block_k
    return triton.cdiv(k, chunk), chunk


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, config: Config | None = None,
           split_k: int | None = None, precision: str | None = None) -> torch.Tensor:
    """`forward` with its choices exposed: a config (default: by M), a split count (default: by the
    tile count) and the dot precision (default: "ieee" for float32)."""
    K = x.shape[-1]
    N = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != K:
        raise ValueError(f"linear: weight {tuple(weight.shape)} does not match x [..., {K}]")
    if weight.dtype != x.dtype:
        raise ValueError(f"linear: weight dtype {weight.dtype} differs from x dtype {x.dtype}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"linear: bias {tuple(bias.shape)} is not [{N}]")
    lead = x.shape[:-1]
    M = math.prod(lead)
    x2 = x.reshape(M, K)  # a view for 2-D (any strides) and contiguous 3-D inputs
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(*lead, N)
    cfg = config or (interpreter_config(M, N) if x.device.type == "cpu" else pick_config(M, x.dtype))
    splits, chunk = split_k_plan(M, N, K, cfg, split_k)
    if precision is None:
        precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp16/bf16 operands are exact either way
    ws = torch.empty((splits, M, N), dtype=torch.float32, device=x.device) if splits > 1 else y
    b = bias if bias is not None else y  # never read without HAS_BIAS
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), splits)
    _linear_kernel[grid](
        x2, weight, b, y, ws, M, N, K, chunk,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), y.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        SPLIT_K=splits, HAS_BIAS=bias is not None, PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _split_k_reduce_kernel[(triton.cdiv(M * N, REDUCE_BLOCK),)](
            ws, b, y, M * N, N, SPLIT_K=splits, HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK, num_warps=4,
        )
    return y.view(*lead, N)


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return launch(x, weight, bias)

"""linear_int4(x, qweight, scales, bias) -> y = x @ dequantize(qweight, scales).T (+ bias): the baseline kernel.

x [..., K] (any strides) float32/float16/bfloat16. qweight uint8 [N, K // 2], contiguous: two 4-bit values
per byte along K, k = 2j in the low nibble of byte j and k = 2j + 1 in the high nibble, each stored as
q + 8 with q in [-8, 7]. scales float32 [N, K // G]: the weight is w[n, k] = q[n, k] * scales[n, k // G],
with the group G = K // scales.shape[1] (128, or 64 where K is not a multiple of 128). bias [N] in
x.dtype or None. y [..., N] contiguous in x.dtype, float32 accumulation, IEEE float32 dots for float32
(never TF32). A self-contained candidate module (kernels/ops/linear_int4.py holds the spec).

linear's tiled GEMM with the weight unpacked in the kernel: each K step (BLOCK_K divides G, so one
group) loads the packed bytes, takes each k's nibble, subtracts 8, converts to x's dtype (exact),
dots with x in float32 and adds the dot times the group's scale to the accumulator. Few output tiles
(decode) are split along K (slices of whole steps): float32 partials to a workspace, added in split
order by a second kernel that adds the bias and casts (no atomics: bitwise deterministic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# --- kernels ------------------------------------------------------------------------------------


@triton.jit
def _linear_int4_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, M, N, K, G, k_chunk,
                        stride_xm, stride_xk, stride_wn, stride_sn, stride_ym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    # Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K): program (t, s) computes output tile t over K
    # slice s, [s * k_chunk, min((s + 1) * k_chunk, K)); tiles in groups of GROUP_M row tiles.
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
    # Rows past M and columns past N wrap onto valid ones (their results are never stored); a K
    # tail (none when G divides K) is masked, with zeros in x that add nothing.
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    k_lo = split * k_chunk  # a multiple of BLOCK_K, so k's parity is offs_k's
    k_hi = tl.minimum(k_lo + k_chunk, K)
    shift = ((offs_k % 2) * 4)[:, None]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k_lo + offs_k)[None, :] * stride_xk
    w_ptrs = w_ptr + rn[None, :] * stride_wn + ((k_lo + offs_k) // 2)[:, None]  # bytes of qweight.T [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k_mask = offs_k < k_hi - k0
        a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
        packed = tl.load(w_ptrs, mask=k_mask[:, None], other=0).to(tl.int32)
        b = (((packed >> shift) & 15) - 8).to(a.dtype)
        scale = tl.load(s_ptr + rn * stride_sn + k0 // G)  # this step's group, per column
        acc += tl.dot(a, b, input_precision=PRECISION) * scale[None, :]
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K // 2

    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:  # workspace [SPLIT_K, M, N] float32
        ws_ptrs = ws_ptr + (split * M + offs_m).to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptrs, acc, mask=mask)


@triton.jit
def _split_k_reduce_kernel(ws_ptr, b_ptr, y_ptr, total, N, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                           BLOCK: tl.constexpr):
    # y (contiguous [M, N], total = M * N) flattened: program p sums the SPLIT_K partials of BLOCK
    # outputs in split order (deterministic), adds the bias and casts.
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
    """One tiling of the GEMM. split_k: whether few output tiles may be split along K. block_k is
    lowered at launch to divide the group."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    split_k: bool = False


# (largest M, config) per token bucket, first match wins: linear's decode tables (kernels/ops/linear_kernel.py)
# with K steps of at most 64, the smaller group. Unpacking nibbles costs registers: linear's prefill tiles
# (and 4 warps at 17-128 rows) spill on sm80 or sm90 (kernels/target_compile.py); these do not.
CONFIGS_16BIT: tuple[tuple[int, Config], ...] = (
    (16, Config(16, 64, 64, 8, 8, 4, split_k=True)),
    (128, Config(64, 128, 64, 8, 8, 4, split_k=True)),
    (1 << 62, Config(64, 128, 64, 8, 8, 4)),
)
CONFIGS_FP32: tuple[tuple[int, Config], ...] = (
    (16, Config(16, 64, 64, 8, 8, 3, split_k=True)),
    (128, Config(32, 64, 32, 8, 8, 3, split_k=True)),
    (1 << 62, Config(64, 64, 32, 8, 8, 3)),
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


def split_k_plan(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int, split_k: bool,
                 splits: int | None = None) -> tuple[int, int]:
    """(splits, K per split): a multiple of block_k, every split non-empty. Host-side, no sync."""
    if splits is None:
        tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
        if not split_k or tiles >= TARGET_PROGRAMS:
            splits = 1
        else:
            splits = min(MAX_SPLIT_K, triton.cdiv(TARGET_PROGRAMS, tiles), triton.cdiv(k, MIN_SPLIT_K))
    splits = max(1, min(splits, triton.cdiv(k, block_k)))
    if splits == 1:
        return 1, k
    chunk = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    return triton.cdiv(k, chunk), chunk


def launch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, *,
           config: Config | None = None, split_k: int | None = None) -> torch.Tensor:
    """`forward` with its choices exposed: a config (default: by M) and a split count (default: by tiles)."""
    K = x.shape[-1]
    N = qweight.shape[0]
    if qweight.dim() != 2 or 2 * qweight.shape[1] != K or qweight.dtype != torch.uint8 or qweight.stride(1) != 1:
        raise ValueError(f"linear_int4: qweight {tuple(qweight.shape)} {qweight.dtype} is not uint8 [N, {K} // 2] "
                         "with contiguous rows")
    groups = scales.shape[-1] if scales.dim() == 2 else 0
    if tuple(scales.shape) != (N, groups) or scales.dtype != torch.float32 or groups == 0 or K % groups \
            or scales.stride(1) != 1:
        raise ValueError(f"linear_int4: scales {tuple(scales.shape)} {scales.dtype} are not float32 [{N}, K // G] with "
                         "contiguous rows")
    G = K // groups
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"linear_int4: bias {tuple(bias.shape)} is not [{N}]")
    lead = x.shape[:-1]
    M = math.prod(lead)
    cfg = config or (interpreter_config(M, N) if x.device.type == "cpu" else pick_config(M, x.dtype))
    block_k = math.gcd(cfg.block_k, G)  # every K step inside one group
    if block_k < 16:
        raise ValueError(f"linear_int4: group {G} is not a multiple of 16")
    x2 = x.reshape(M, K)  # a view for 2-D (any strides) and contiguous 3-D inputs
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y.view(*lead, N)
    splits, chunk = split_k_plan(M, N, K, cfg.block_m, cfg.block_n, block_k, cfg.split_k, split_k)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp16/bf16 operands are exact either way
    ws = torch.empty((splits, M, N), dtype=torch.float32, device=x.device) if splits > 1 else y
    b = bias if bias is not None else y  # never read without HAS_BIAS
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), splits)
    _linear_int4_kernel[grid](
        x2, qweight, scales, b, y, ws, M, N, K, G, chunk,
        x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), y.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, GROUP_M=cfg.group_m,
        SPLIT_K=splits, HAS_BIAS=bias is not None, PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _split_k_reduce_kernel[(triton.cdiv(M * N, REDUCE_BLOCK),)](
            ws, b, y, M * N, N, SPLIT_K=splits, HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK, num_warps=4,
        )
    return y.view(*lead, N)


def forward(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return launch(x, qweight, scales, bias)

"""linear(x, weight, bias) -> y = x @ weight.T (+ bias): a tiled tl.dot GEMM (prefill, and the CPU
interpreter's few-large-tiles choice) and a split-K GEMM for few output tiles (decode).

x [..., K] (any strides), weight [N, K], bias [N] or None; y [..., N] contiguous in x.dtype, float32
accumulation, IEEE float32 dots for float32 (never TF32). Both share one kernel: grouped tile order
(group_m row tiles, a runtime argument), every load and store masked. split-K writes float32 partials
to a workspace and a second kernel adds them in split order: deterministic, no atomics. The split
count comes from the shapes only (no sync): max(1, min(MAX_SPLITS, cdiv(TARGET_PROGRAMS, tiles),
cdiv(K, MIN_SPLIT_K), cdiv(K, BLOCK_K))), 1 when the tiles alone fill the GPU.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

from kernelloop.kernels.ops.linear_kernel import TARGET_PROGRAMS

from . import check_params, gpu_choices, header_line, next_pow2, pick

OP = "linear"
MIN_SPLIT_K = 256  # K per split, about: no split shorter than this
SHARED_BYTES = 232448  # sm90's shared memory per block

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "tiled": {"block_m": [32, 64, 128], "block_n": [64, 128, 256], "block_k": [32, 64], "group_m": [4, 8],
              "num_warps": [4, 8], "num_stages": [3, 4]},
    "splitk": {"block_m": [16], "block_n": [32, 64, 128], "block_k": [64, 128, 256], "max_splits": [4, 16],
               "num_warps": [4, 8], "num_stages": [4]},
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_plan(params: Mapping[str, Any], m: int, n: int, k: int) -> tuple[int, int]:
    """(splits, K per split) a config launches at (m, n, k): the same formula as its forward."""
    bk = int(params["block_k"])
    tiles = _cdiv(m, int(params["block_m"])) * _cdiv(n, int(params["block_n"]))
    splits = 1
    if params["template"] == "splitk" and tiles < TARGET_PROGRAMS:
        splits = min(int(params["max_splits"]), _cdiv(TARGET_PROGRAMS, tiles), _cdiv(k, MIN_SPLIT_K))
    splits = max(1, min(splits, _cdiv(k, bk)))
    if splits == 1:
        return 1, k
    chunk = _cdiv(_cdiv(k, splits), bk) * bk
    return _cdiv(k, chunk), chunk


def interpreter_cost(params: Mapping[str, Any], shape: Mapping[str, int]) -> int:
    """What the CPU interpreter pays, roughly: a fixed cost per program instance and per K step."""
    m, n, k = int(shape["tokens"]), int(shape["n"]), int(shape["k"])
    splits, chunk = split_plan(params, m, n, k)
    programs = _cdiv(m, int(params["block_m"])) * _cdiv(n, int(params["block_n"])) * splits
    return programs * (3 + _cdiv(chunk, int(params["block_k"]))) + (2 if splits > 1 else 0)


def fits_sm90(params: Mapping[str, Any], itemsize: int) -> bool:
    """Pipelined operand tiles within shared memory, and an accumulator of at most 128 registers a thread."""
    bm, bn, bk = int(params["block_m"]), int(params["block_n"]), int(params["block_k"])
    shared = int(params["num_stages"]) * (bm + bn) * bk * itemsize
    return shared <= SHARED_BYTES and bm * bn <= 128 * 32 * int(params["num_warps"])


def _shapes(ctx: Any) -> list[dict[str, int]]:
    return [dict(s) for s in ctx.shapes if {"tokens", "n", "k"} <= set(s)]


# First choices on a GPU: (block_m, block_n, block_k, group_m or max_splits, num_warps, num_stages) per
# template and float32-or-not. 16-bit: Triton's matmul tutorial for H100 (prefill), the baseline's
# decode tile; float32 (IEEE dots on the FMA units, operands twice as wide): smaller tiles, 8 warps.
_GPU_FIRST = {
    ("tiled", False): (128, 128, 64, 8, 8, 3), ("tiled", True): (64, 128, 32, 8, 8, 3),
    ("splitk", False): (16, 64, 128, 16, 8, 4), ("splitk", True): (16, 64, 64, 16, 8, 4),
}
# The interpreter ignores warps, stages and tile order: one value each on the CPU.
CPU_FIXED = {"group_m": 8, "max_splits": 4, "num_warps": 4, "num_stages": 4}


def _cap(values: list[int], size: int | None) -> int:
    """The largest value worth trying for a dimension of `size`: bigger tiles only add masked lanes."""
    return values[-1] if size is None else max(values[0], next_pow2(size))


def space(ctx: Any) -> list[dict[str, Any]]:
    full = gpu_choices(ctx)
    shapes = _shapes(ctx)
    fp32 = getattr(ctx, "dtype", "bfloat16") == "float32"
    m, n, k = (max((s[key] for s in shapes), default=None) for key in ("tokens", "n", "k"))
    out: list[dict[str, Any]] = []
    for template, domain in DOMAINS.items():
        names = list(domain)
        first = dict(zip(names, _GPU_FIRST[(template, fp32)]))
        first["block_m"] = min(first["block_m"], _cap(domain["block_m"], m))
        lists = [pick(domain[key], full, CPU_FIXED[key]) if key in CPU_FIXED else domain[key] for key in names]
        configs = []
        for values in itertools.product(*lists):
            p = {"template": template, **dict(zip(names, values))}
            if p["block_m"] > _cap(domain["block_m"], m):
                continue  # taller than any input
            if full and not fits_sm90(p, 4 if fp32 else 2):
                continue  # spills or overflows shared memory (bench/compile_targets)
            if not full and (p["block_n"] > _cap(domain["block_n"], n) or p["block_k"] > _cap(domain["block_k"], k)):
                continue
            configs.append(p)
        if full:  # nearest to the first choice first
            configs.sort(key=lambda p: sum(abs(domain[x].index(p[x]) - domain[x].index(first[x])) for x in names))
        elif shapes:  # the fewest program instances and K steps first
            configs.sort(key=lambda p: (sum(interpreter_cost(p, s) for s in shapes), -p["block_k"], p["block_m"]))
        out.extend(configs)
    return out


_COMMON = '''
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
    for k0 in range(k_lo, k_hi, BLOCK_K):
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
        raise ValueError(f"linear: weight {{tuple(weight.shape)}} does not match x [..., {{K}}]")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"linear: bias {{tuple(bias.shape)}} is not [{{N}}]")
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


{constants}
'''

DESCRIPTIONS = {
    "tiled": "a tiled tl.dot GEMM with grouped tile order, one program per output tile",
    "splitk": "a tiled tl.dot GEMM split along K when the output tiles are few, partials added in a fixed order",
}


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    t = params["template"]
    consts = [f"BLOCK_M = {int(params['block_m'])}", f"BLOCK_N = {int(params['block_n'])}",
              f"BLOCK_K = {int(params['block_k'])}", f"NUM_WARPS = {int(params['num_warps'])}",
              f"NUM_STAGES = {int(params['num_stages'])}", "REDUCE_BLOCK = 1024"]
    if t == "tiled":
        consts += [f"GROUP_M = {int(params['group_m'])}", "MAX_SPLITS = 1"]
    else:
        consts += ["GROUP_M = 8", f"MAX_SPLITS = {int(params['max_splits'])}"]
    consts += [f"TARGET_PROGRAMS = {TARGET_PROGRAMS}", f"MIN_SPLIT_K = {MIN_SPLIT_K}"]
    # The kernels come first and the constants last, so every config's kernels have the same text
    # and line numbers (bench/compile_targets compiles equal kernels once).
    doc = f'"""linear(x, weight, bias) -> y: {DESCRIPTIONS[t]} (generated by the search proposer)."""\n'
    return header_line(OP, params) + "\n" + doc + _COMMON.format(constants="\n".join(consts))

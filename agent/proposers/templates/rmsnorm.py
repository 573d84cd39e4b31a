"""rmsnorm(x, weight, eps) -> y: whole row per program (the baseline kernel, kernels/ops/rmsnorm_kernel.py,
with its warps as the parameter), several rows per 2-D tile, two-pass chunked."""

from __future__ import annotations

from typing import Any

from kernelloop.kernels.ops.rmsnorm_kernel import MAX_FUSED_SIZE, num_warps_for

from . import check_params, from_baseline, gpu_choices, header_line, next_pow2, pick, shape_max

OP = "rmsnorm"
MAX_ROW = MAX_FUSED_SIZE  # a whole row in one program's registers
MAX_TILE = 16384  # elements of one [ROWS, BLOCK] tile; wider rows get fewer rows per program

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "row": {"num_warps": [1, 2, 4, 8, 16]},
    "multirow": {"rows": [2, 4, 8, 16], "num_warps": [2, 4, 8]},
    "chunked": {"block": [256, 512, 1024, 2048], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3]},
}


def _near_first(values: list[Any], target: Any) -> list[Any]:
    return sorted(values, key=lambda v: (abs(values.index(v) - values.index(target)) if target in values else 0,
                                         values.index(v)))


def space(ctx: Any, key: str = "hidden") -> list[dict[str, Any]]:
    """Shared by rmsnorm and fused_add_rmsnorm (same row structure; `key` names the row length)."""
    full = gpu_choices(ctx)
    hidden = shape_max(ctx.shapes, key)
    tokens = shape_max(ctx.shapes, "tokens")
    out: list[dict[str, Any]] = []
    whole_ok = hidden is None or hidden <= MAX_ROW
    block = next_pow2(hidden) if hidden else None
    if whole_ok:
        warps = DOMAINS["row"]["num_warps"]
        target = min(num_warps_for(block), 16) if block else 4
        for w in _near_first(warps, target) if full else [target]:
            out.append({"template": "row", "num_warps": w})
        for r in (4, 2, 8, 16):
            if block is not None and r > 2 and r * block > MAX_TILE:
                continue  # clamped at run time to fewer rows: a duplicate of a smaller ROWS
            if tokens is not None and r > 2 and r > next_pow2(tokens):
                continue  # more rows per program than the profile ever has
            for w in pick([4, 8, 2], full, 4):
                out.append({"template": "multirow", "rows": r, "num_warps": w})
    for b in (2048, 1024, 512, 256):
        if block is not None and b >= block:
            continue  # one chunk covers the row: that is the whole-row kernel reading twice
        for w in pick([8, 4, 2], full, 4):
            for s in pick([2, 1, 3], full, 2):
                out.append({"template": "chunked", "block": b, "num_warps": w, "num_stages": s})
    return out


_COMMON = '''
from __future__ import annotations

import torch
import triton
import triton.language as tl

{constants}


def _rows(t):
    # [..., N] -> [rows, N] with unit stride along N (a view when possible, else a copy)
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()
'''

_MULTIROW = '''

@triton.jit
def _tile_kernel(x_ptr, w_ptr, y_ptr, n_rows, stride_x, stride_y, n_cols, eps,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows per program in one [ROWS, BLOCK] tile; the weight row is loaded once per program.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, weight, eps):
    n = x.shape[-1]
    if n > MAX_ROW:
        raise ValueError(f"rmsnorm: hidden size {n} exceeds {MAX_ROW}")
    x2 = _rows(x)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        w = weight.contiguous()
        block = triton.next_power_of_2(n)
        per = max(1, min(ROWS_PER_PROGRAM, MAX_TILE // block))  # powers of two: a power of two
        _tile_kernel[(triton.cdiv(rows, per),)](x2, w, y, rows, x2.stride(0), y.stride(0), n, eps,
                                                ROWS=per, BLOCK=block, num_warps=NUM_WARPS)
    return y.view(x.shape)
'''

_CHUNKED = '''

@triton.jit
def _chunked_kernel(x_ptr, w_ptr, y_ptr, n_rows, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr,
                    STAGES: tl.constexpr):
    # One program per row, two passes over BLOCK-wide chunks: sum of squares, then scale and store.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, weight, eps):
    n = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        w = weight.contiguous()
        block = min(BLOCK_SIZE, triton.next_power_of_2(n))
        _chunked_kernel[(rows,)](x2, w, y, rows, x2.stride(0), y.stride(0), n, eps, BLOCK=block,
                                 STAGES=NUM_STAGES, num_warps=NUM_WARPS)
    return y.view(x.shape)
'''

DESCRIPTIONS = {
    "row": "one program per row, the whole row in registers",
    "multirow": "several rows per program in a 2-D [ROWS, BLOCK] tile",
    "chunked": "one program per row, two passes over column chunks",
}


def constants(params: dict[str, Any]) -> str:
    """The module constants of a multirow or chunked config."""
    t = params["template"]
    if t == "multirow":
        return (f"MAX_ROW = {MAX_ROW}\nMAX_TILE = {MAX_TILE}\nROWS_PER_PROGRAM = {int(params['rows'])}\n"
                f"NUM_WARPS = {int(params['num_warps'])}")
    if t == "chunked":
        return (f"BLOCK_SIZE = {int(params['block'])}\nNUM_WARPS = {int(params['num_warps'])}\n"
                f"NUM_STAGES = {int(params['num_stages'])}")
    raise ValueError(f"{OP}: unknown template {t!r}")


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    t = params["template"]
    if t == "row":
        return from_baseline(OP, params, {"NUM_WARPS": int(params["num_warps"])})
    body = {"multirow": _MULTIROW, "chunked": _CHUNKED}[t]
    doc = f'"""rmsnorm(x, weight, eps) -> y: {DESCRIPTIONS[t]} (generated by the search proposer)."""\n'
    return header_line(OP, params) + "\n" + doc + _COMMON.format(constants=constants(params)) + body

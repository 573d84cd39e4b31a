"""silu_mul(x) -> y, x [..., 2d]: 2-D grid (rows, column blocks: the baseline kernel,
kernels/ops/silu_mul_kernel.py, with its block and warps as parameters), flat 1-D grid, several rows
per program."""

from __future__ import annotations

from typing import Any

from . import check_params, from_baseline, gpu_choices, header_line, next_pow2, pick, shape_max

OP = "silu_mul"

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "grid2d": {"block": [128, 256, 512, 1024, 2048], "num_warps": [2, 4, 8]},
    "flat": {"block": [256, 512, 1024, 2048, 4096], "num_warps": [2, 4, 8]},
    "rows": {"rows": [2, 4, 8, 16], "block": [128, 256, 512, 1024], "num_warps": [4, 8]},
}


def space(ctx: Any) -> list[dict[str, Any]]:
    full = gpu_choices(ctx)
    d = shape_max(ctx.shapes, "d")
    tokens = shape_max(ctx.shapes, "tokens")
    total = max((int(s["tokens"]) * int(s["d"]) for s in ctx.shapes if "tokens" in s and "d" in s), default=None)
    out: list[dict[str, Any]] = []
    for b in (1024, 512, 2048, 256, 128):
        if d is not None and b > max(128, next_pow2(d)):
            continue  # wider than any row: a duplicate of the next smaller block
        for w in pick([4, 8, 2], full, 4):
            out.append({"template": "grid2d", "block": b, "num_warps": w})
    for b in (1024, 2048, 4096, 512, 256):
        if total is not None and b > max(256, next_pow2(total)):
            continue
        for w in pick([4, 8, 2], full, 4):
            out.append({"template": "flat", "block": b, "num_warps": w})
    for r in (4, 2, 8, 16):
        if tokens is not None and r > 2 and r > next_pow2(tokens):
            continue
        for b in (256, 512, 128, 1024):
            if d is not None and b > max(128, next_pow2(d)):
                continue
            if r * b > 8192:
                continue
            for w in pick([4, 8], full, 4):
                out.append({"template": "rows", "rows": r, "block": b, "num_warps": w})
    return out


_COMMON = '''
from __future__ import annotations

import torch
import triton
import triton.language as tl

{constants}


def _rows(t):
    # [..., 2d] -> [rows, 2d] with unit stride along the last dim (a view when possible, else a copy)
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()
'''

_FLAT = '''

@triton.jit
def _flat_kernel(x_ptr, y_ptr, total, d, stride_x, stride_y, BLOCK: tl.constexpr):
    # A flat grid over every output element: row = i // d, col = i % d.
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    row = idx // d
    col = idx % d
    gate = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + col, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + row * stride_y + col, y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x):
    if x.shape[-1] % 2:
        raise ValueError(f"silu_mul: last dim {x.shape[-1]} is not even")
    d = x.shape[-1] // 2
    x2 = _rows(x)
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    total = rows * d
    if total > 0:
        _flat_kernel[(triton.cdiv(total, BLOCK_SIZE),)](x2, y, total, d, x2.stride(0), y.stride(0),
                                                        BLOCK=BLOCK_SIZE, num_warps=NUM_WARPS)
    return y.view(*x.shape[:-1], d)
'''

_ROWS = '''

@triton.jit
def _tile_kernel(x_ptr, y_ptr, n_rows, stride_x, stride_y, d, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # Program (i, b): rows i*ROWS .. i*ROWS+ROWS-1, columns b*BLOCK .. b*BLOCK+BLOCK-1, one 2-D tile.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
    src = x_ptr + rows[:, None] * stride_x + cols[None, :]
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x):
    if x.shape[-1] % 2:
        raise ValueError(f"silu_mul: last dim {x.shape[-1]} is not even")
    d = x.shape[-1] // 2
    x2 = _rows(x)
    rows = x2.shape[0]
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    if rows > 0 and d > 0:
        block = min(BLOCK_SIZE, max(16, triton.next_power_of_2(d)))
        grid = (triton.cdiv(rows, ROWS_PER_PROGRAM), triton.cdiv(d, block))
        _tile_kernel[grid](x2, y, rows, x2.stride(0), y.stride(0), d, ROWS=ROWS_PER_PROGRAM, BLOCK=block,
                           num_warps=NUM_WARPS)
    return y.view(*x.shape[:-1], d)
'''

DESCRIPTIONS = {
    "grid2d": "2-D grid over (rows, column blocks)",
    "flat": "flat 1-D grid over every output element",
    "rows": "2-D grid of [ROWS, BLOCK] tiles",
}


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    t = params["template"]
    if t == "grid2d":
        return from_baseline(OP, params, {"BLOCK_SIZE": int(params["block"]), "NUM_WARPS": int(params["num_warps"])})
    consts = f"BLOCK_SIZE = {int(params['block'])}\nNUM_WARPS = {int(params['num_warps'])}"
    if t == "rows":
        consts += f"\nROWS_PER_PROGRAM = {int(params['rows'])}"
    body = {"flat": _FLAT, "rows": _ROWS}[t]
    doc = f'"""silu_mul(x) -> y: {DESCRIPTIONS[t]} (generated by the search proposer)."""\n'
    return header_line(OP, params) + "\n" + doc + _COMMON.format(constants=consts) + body

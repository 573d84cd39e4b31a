"""fused_add_rmsnorm(x, residual, weight, eps) -> (y, residual_out): the rmsnorm structures; "row" is
the baseline kernel (kernels/ops/fused_add_rmsnorm_kernel.py) with its warps as the parameter.

r = (x + residual) is added in float32 and rounded to the input dtype; that ROUNDED r is both the
returned residual_out and what y normalises (kernels/ops/fused_add_rmsnorm_kernel.py).
The chunked template's second pass either reloads the r it stored ("reload": each element is read
back by the thread that wrote it, same offsets and layout) or recomputes it from x and residual.
"""

from __future__ import annotations

from typing import Any

from . import check_params, from_baseline, header_line
from . import rmsnorm as _rms

OP = "fused_add_rmsnorm"
MAX_ROW = _rms.MAX_ROW
MAX_TILE = _rms.MAX_TILE

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "row": dict(_rms.DOMAINS["row"]),
    "multirow": dict(_rms.DOMAINS["multirow"]),
    "chunked": {**_rms.DOMAINS["chunked"], "pass2": ["reload", "recompute"]},
}


def space(ctx: Any) -> list[dict[str, Any]]:
    out = []
    for p in _rms.space(ctx):
        if p["template"] == "chunked":
            for mode in ("reload", "recompute"):
                out.append({**p, "pass2": mode})
        else:
            out.append(p)
    return out


_COMMON = _rms._COMMON

_MULTIROW = '''

@triton.jit
def _tile_kernel(x_ptr, res_ptr, w_ptr, y_ptr, r_ptr, n_rows, s_x, s_res, s_y, s_r, n_cols, eps,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows per program in one [ROWS, BLOCK] tile; y normalises the rounded residual_out.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * s_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    res = tl.load(res_ptr + rows[:, None] * s_res + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = (x + res).to(r_ptr.dtype.element_ty)
    tl.store(r_ptr + rows[:, None] * s_r + cols[None, :], r, mask=mask)
    rf = r.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(rf * rf, axis=1) / n_cols + eps)
    y = rf * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows[:, None] * s_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, residual, weight, eps):
    n = x.shape[-1]
    if n > MAX_ROW:
        raise ValueError(f"fused_add_rmsnorm: hidden size {n} exceeds {MAX_ROW}")
    if residual.shape != x.shape:
        raise ValueError("fused_add_rmsnorm: residual and x shapes differ")
    x2, res2 = _rows(x), _rows(residual)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    r_out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        w = weight.contiguous()
        block = triton.next_power_of_2(n)
        per = max(1, min(ROWS_PER_PROGRAM, MAX_TILE // block))
        _tile_kernel[(triton.cdiv(rows, per),)](x2, res2, w, y, r_out, rows, x2.stride(0), res2.stride(0),
                                                y.stride(0), r_out.stride(0), n, eps, ROWS=per, BLOCK=block,
                                                num_warps=NUM_WARPS)
    return y.view(x.shape), r_out.view(x.shape)
'''

_CHUNKED = '''

@triton.jit
def _chunked_kernel(x_ptr, res_ptr, w_ptr, y_ptr, r_ptr, n_rows, s_x, s_res, s_y, s_r, n_cols, eps,
                    BLOCK: tl.constexpr, STAGES: tl.constexpr, RELOAD: tl.constexpr):
    # Pass one: r = x + residual (rounded), stored, sum of squares; pass two: y = r * rstd * w.
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * s_x + offs, mask=mask, other=0.0).to(tl.float32)
        res = tl.load(res_ptr + row * s_res + offs, mask=mask, other=0.0).to(tl.float32)
        r = (x + res).to(r_ptr.dtype.element_ty)
        tl.store(r_ptr + row * s_r + offs, r, mask=mask)
        rf = r.to(tl.float32)
        acc += rf * rf
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        if RELOAD:
            rf = tl.load(r_ptr + row * s_r + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_ptr + row * s_x + offs, mask=mask, other=0.0).to(tl.float32)
            res = tl.load(res_ptr + row * s_res + offs, mask=mask, other=0.0).to(tl.float32)
            rf = (x + res).to(r_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * s_y + offs, (rf * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def forward(x, residual, weight, eps):
    n = x.shape[-1]
    if residual.shape != x.shape:
        raise ValueError("fused_add_rmsnorm: residual and x shapes differ")
    x2, res2 = _rows(x), _rows(residual)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    r_out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows > 0 and n > 0:
        w = weight.contiguous()
        block = min(BLOCK_SIZE, triton.next_power_of_2(n))
        _chunked_kernel[(rows,)](x2, res2, w, y, r_out, rows, x2.stride(0), res2.stride(0), y.stride(0),
                                 r_out.stride(0), n, eps, BLOCK=block, STAGES=NUM_STAGES, RELOAD=RELOAD,
                                 num_warps=NUM_WARPS)
    return y.view(x.shape), r_out.view(x.shape)
'''

DESCRIPTIONS = {
    "row": "one program per row, the whole row in registers",
    "multirow": "several rows per program in a 2-D [ROWS, BLOCK] tile",
    "chunked": "one program per row, two passes over column chunks",
}


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    t = params["template"]
    if t == "row":
        return from_baseline(OP, params, {"NUM_WARPS": int(params["num_warps"])})
    consts = _rms.constants({k: v for k, v in params.items() if k != "pass2"})
    if t == "chunked":
        consts += f"\nRELOAD = {params['pass2'] == 'reload'}"
    body = {"multirow": _MULTIROW, "chunked": _CHUNKED}[t]
    doc = (f'"""fused_add_rmsnorm(x, residual, weight, eps) -> (y, residual_out): {DESCRIPTIONS[t]} '
           '(generated by the search proposer)."""\n')
    return header_line(OP, params) + "\n" + doc + _COMMON.format(constants=consts) + body

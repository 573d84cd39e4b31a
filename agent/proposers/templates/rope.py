"""rope(q, k, positions, cos_sin_cache) -> (q_out, k_out), NeoX style: per token over all heads (the
baseline kernel, kernels/ops/rope_kernel.py, with its heads per step and warps as parameters), or per
(token, head block).

q [T, Hq, D], k [T, Hk, D] (any token/head strides; unit stride along D, else copied), positions [T]
int64, cos_sin_cache [max_pos, D] float32 (cos half | sin half). With x1 = x[..., :D/2],
x2 = x[..., D/2:]: out = cat(x1*cos - x2*sin, x2*cos + x1*sin) in x's dtype; outputs are new
contiguous tensors. BLOCK_HALF = next_pow2(D/2) covers one half of a head.
"""

from __future__ import annotations

from typing import Any

from . import check_params, from_baseline, gpu_choices, header_line, next_pow2, pick, shape_max

OP = "rope"

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "token": {"heads": [1, 2, 4, 8, 16, 32], "num_warps": [1, 2, 4, 8]},
    "head": {"heads": [1, 2, 4, 8], "num_warps": [1, 2, 4]},
}


def space(ctx: Any) -> list[dict[str, Any]]:
    full = gpu_choices(ctx)
    heads = shape_max(ctx.shapes, "q_heads", "kv_heads")
    head_dim = shape_max(ctx.shapes, "head_dim")
    half_block = next_pow2(head_dim // 2) if head_dim else None
    out: list[dict[str, Any]] = []
    for h in (8, 16, 4, 32, 2, 1):
        if heads is not None and h > 1 and h > next_pow2(heads):
            continue  # more heads per iteration than the model has: a duplicate of a smaller tile
        if half_block is not None and h > 1 and h * half_block > 4096:
            continue
        for w in pick([4, 2, 8, 1], full, 4):
            out.append({"template": "token", "heads": h, "num_warps": w})
    for h in (1, 2, 4, 8):
        if heads is not None and h > 1 and h > next_pow2(heads):
            continue
        for w in pick([2, 1, 4], full, 2):
            out.append({"template": "head", "heads": h, "num_warps": w})
    return out


_COMMON = '''
from __future__ import annotations

import torch
import triton
import triton.language as tl

{constants}


@triton.jit
def _rotate(x_ptr, o_ptr, s_xt, s_xh, s_ot, s_oh, token, h0, n_heads, cos, sin, half,
            HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # Heads h0 .. h0+HEADS-1 of one token; cos/sin: [1, BLOCK_HALF] float32.
    heads = (h0 + tl.arange(0, HEADS))[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < n_heads) & (dims < half)
    x_off = token * s_xt + heads * s_xh + dims
    x1 = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_off + half, mask=mask, other=0.0).to(tl.float32)
    o_off = token * s_ot + heads * s_oh + dims
    ty = o_ptr.dtype.element_ty
    tl.store(o_ptr + o_off, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(o_ptr + o_off + half, (x2 * cos + x1 * sin).to(ty), mask=mask)


@triton.jit
def _cos_sin(pos_ptr, cache_ptr, s_cache, token, n_tokens, half, BLOCK_HALF: tl.constexpr):
    # The token's cos and sin rows, [1, BLOCK_HALF] each, widened to float32.
    one = tl.arange(0, 1)
    pos = tl.sum(tl.load(pos_ptr + token + one, mask=(token + one) < n_tokens, other=0).to(tl.int64), axis=0)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    dmask = dims < half
    cos = tl.load(cache_ptr + pos * s_cache + dims, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * s_cache + half + dims, mask=dmask, other=0.0).to(tl.float32)
    return cos, sin


def _check(q, k, cos_sin_cache):
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"rope: expected q [T, Hq, D], k [T, Hk, D]; got {{tuple(q.shape)}}, {{tuple(k.shape)}}")
    if q.shape[2] % 2 or cos_sin_cache.shape[-1] != q.shape[2]:
        raise ValueError("rope: head_dim must be even and match the cache width")
'''

_HEAD = '''

@triton.jit
def _rope_head_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cache_ptr,
                      s_qt, s_qh, s_kt, s_kh, s_qot, s_qoh, s_kot, s_koh, s_cache,
                      n_tokens, n_q_heads, n_k_heads, q_blocks, half,
                      HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # Program (token, j): q heads j*HEADS.. for j < q_blocks, else k heads (j - q_blocks)*HEADS..
    token = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    cos, sin = _cos_sin(pos_ptr, cache_ptr, s_cache, token, n_tokens, half, BLOCK_HALF)
    if j < q_blocks:
        _rotate(q_ptr, qo_ptr, s_qt, s_qh, s_qot, s_qoh, token, j * HEADS, n_q_heads, cos, sin, half,
                HEADS, BLOCK_HALF)
    else:
        _rotate(k_ptr, ko_ptr, s_kt, s_kh, s_kot, s_koh, token, (j - q_blocks) * HEADS, n_k_heads, cos, sin,
                half, HEADS, BLOCK_HALF)


def forward(q, k, positions, cos_sin_cache):
    _check(q, k, cos_sin_cache)
    t, hq, d = q.shape
    hk = k.shape[1]
    q_in = q if q.stride(-1) == 1 else q.contiguous()
    k_in = k if k.stride(-1) == 1 else k.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t == 0 or d == 0:
        return q_out, k_out
    half = d // 2
    q_blocks = triton.cdiv(hq, HEADS_PER_PROGRAM)
    k_blocks = triton.cdiv(hk, HEADS_PER_PROGRAM)
    if q_blocks + k_blocks == 0:
        return q_out, k_out
    _rope_head_kernel[(t, q_blocks + k_blocks)](
        q_in, k_in, q_out, k_out, positions, cache,
        q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cache.stride(0),
        t, hq, hk, q_blocks, half, HEADS=HEADS_PER_PROGRAM, BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=NUM_WARPS,
    )
    return q_out, k_out
'''

DESCRIPTIONS = {
    "token": "one program per token over all heads",
    "head": "one program per (token, block of heads)",
}


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    if params["template"] == "token":
        return from_baseline(OP, params, {"HEADS_PER_STEP": int(params["heads"]),
                                          "NUM_WARPS": int(params["num_warps"])})
    consts = f"HEADS_PER_PROGRAM = {int(params['heads'])}\nNUM_WARPS = {int(params['num_warps'])}"
    doc = (f'"""rope(q, k, positions, cos_sin_cache) -> (q_out, k_out): {DESCRIPTIONS["head"]} '
           '(generated by the search proposer)."""\n')
    return header_line(OP, params) + "\n" + doc + _COMMON.format(constants=consts) + _HEAD

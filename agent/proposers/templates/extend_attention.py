"""extend_attention(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale) -> o: causal
GQA prefill over a paged prefix, flash style (one pass per block of new tokens), and a split-KV
variant that spreads a long prefix over several programs and merges them by log-sum-exp.

Program (virtual block, kv head[, part]): BLOCK_M rows = BLOCK_M / next_pow2(G) new tokens of one
request times the G query heads of one kv head, token-major; each K/V tile is loaded once per group.
Request b owns virtual blocks qo_indptr[b] // BLOCK_T + b ..., so T // BLOCK_T + B blocks cover every
request and a program finds its request by binary search (no host sync; the launch depends on
shapes only). split-KV: parts 0 .. S-1 take equal BLOCK_N-aligned chunks of the prefix, part S the
new tokens (causal), each writing a normalised float32 partial and its lse; a merge kernel adds
them in part order. S = max(1, min(MAX_SPLITS, cdiv(TARGET_PROGRAMS, programs),
cdiv(kv_indices.numel() / B, MIN_SPLIT_TOKENS))), 1 (one pass, no workspace) when the blocks fill the GPU.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import check_params, gpu_choices, header_line, next_pow2, pick

OP = "extend_attention"
TARGET_PROGRAMS = 528  # programs worth launching: ~4 waves of an H100/H200's 132 SMs

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "flash": {"block_m": [64, 128], "block_n": [16, 32, 64], "num_warps": [4, 8], "num_stages": [1, 2]},
    "splitkv": {"block_m": [64, 128], "block_n": [32, 64], "max_splits": [4, 8], "min_split_tokens": [16, 256],
                "num_warps": [4, 8], "num_stages": [2]},
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def splits_for(params: Mapping[str, Any], shape: Mapping[str, int]) -> int:
    """Prefix parts a config launches at `shape` (the same formula as its forward)."""
    if params["template"] != "splitkv":
        return 1
    B, T, P = int(shape["batch"]), int(shape["tokens"]), int(shape["prefix"])
    G = max(1, int(shape["q_heads"]) // max(int(shape["kv_heads"]), 1))
    block_t = max(int(params["block_m"]), next_pow2(G)) // next_pow2(G)
    programs = (T // block_t + B) * int(shape["kv_heads"])
    if programs >= TARGET_PROGRAMS or P == 0:
        return 1
    return max(1, min(int(params["max_splits"]), _cdiv(TARGET_PROGRAMS, programs),
                      _cdiv(P, int(params["min_split_tokens"]))))


def interpreter_cost(params: Mapping[str, Any], shape: Mapping[str, int]) -> int:
    """Program instances times K/V tiles each, roughly what the CPU interpreter pays."""
    B, T, P = int(shape["batch"]), int(shape["tokens"]), int(shape["prefix"])
    G = max(1, int(shape["q_heads"]) // max(int(shape["kv_heads"]), 1))
    block_t = max(int(params["block_m"]), next_pow2(G)) // next_pow2(G)
    tiles = _cdiv(P, int(params["block_n"])) + _cdiv(_cdiv(T, max(B, 1)), int(params["block_n"]))
    return (T // block_t + B) * int(shape["kv_heads"]) * (4 + tiles) * splits_for(params, shape)


def fits_sm90(params: Mapping[str, Any]) -> bool:
    """At head_dim 128 the float32 accumulator of BLOCK_M rows takes BLOCK_M * 128 / threads registers:
    more than 16 rows a warp spills (bench/compile_targets: 128 rows at 4 warps spill 300-3300 bytes)."""
    return int(params["block_m"]) <= 16 * int(params["num_warps"])


def _shapes(ctx: Any) -> list[dict[str, int]]:
    keys = {"batch", "tokens", "prefix", "q_heads", "kv_heads", "head_dim"}
    return [dict(s) for s in ctx.shapes if keys <= set(s)]


def space(ctx: Any) -> list[dict[str, Any]]:
    full = gpu_choices(ctx)
    shapes = _shapes(ctx)
    fp32 = getattr(ctx, "dtype", "bfloat16") == "float32"
    out: list[dict[str, Any]] = []
    # fp16/bf16: the baseline's 128 x 32 tile at 8 warps first; float32 (IEEE dots, FMA units) 64 x 16.
    first_m, first_n = (64, 16) if fp32 and full else (128, 32)
    for bm in sorted(DOMAINS["flash"]["block_m"], key=lambda v: abs(v - first_m)):
        for bn in sorted(DOMAINS["flash"]["block_n"], key=lambda v: abs(v - first_n)):
            for w in pick([8, 4], full, 4):
                for st in pick([2, 1], full, 1):
                    p = {"template": "flash", "block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st}
                    if not full or fits_sm90(p):
                        out.append(p)
    if full:  # more programs never pay in the interpreter
        seen: set[tuple] = set()
        for bm in (128, 64):
            for bn in (32, 64):
                for mst in (256, 16):
                    for ms in (8, 4):
                        for w in (8, 4):
                            p = {"template": "splitkv", "block_m": bm, "block_n": bn, "max_splits": ms,
                                 "min_split_tokens": mst, "num_warps": w, "num_stages": 2}
                            if not fits_sm90(p):
                                continue
                            if shapes:  # configs that split every profiled shape alike are one
                                key = (bm, bn, w, tuple(splits_for(p, s) for s in shapes))
                                if key in seen or all(k == 1 for k in key[3]):
                                    continue
                                seen.add(key)
                            out.append(p)
    if shapes and not full:
        out.sort(key=lambda p: sum(interpreter_cost(p, s) for s in shapes))
    return out


_COMMON = '''
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _find_request(qo_indptr_ptr, blk, B, search_steps, BLOCK_T: tl.constexpr):
    # The last request b whose first virtual block (qo_indptr[b] // BLOCK_T + b) is <= blk.
    lo = blk * 0
    hi = lo + B
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        first = (tl.load(qo_indptr_ptr + mid) // BLOCK_T + mid).to(tl.int32)
        right = first <= blk
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo


@triton.jit
def _step(q, k, v, visible, m_i, l_i, acc, sm_scale, PRECISION: tl.constexpr):
    # One K/V tile of the online softmax; `visible` masks keys a row must not see.
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(qk - m_safe[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc


@triton.jit
def _extend_kernel(q_ptr, k_ptr, v_ptr, o_ptr, kb_ptr, vb_ptr, qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr,
                   mid_o_ptr, mid_lse_ptr, sm_scale, B, search_steps, G, D, Hq, T, splits,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                   stride_kbt, stride_kbh, stride_vbt, stride_vbh,
                   BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   PARTIAL: tl.constexpr, PRECISION: tl.constexpr):
    # Program (virtual block, kv head, part). Row r: new token m0 + r // BLOCK_G of the request, query
    # head kv_head * G + r % BLOCK_G. Not PARTIAL: the whole prefix and the new tokens, o written.
    # PARTIAL: part < splits takes one prefix chunk, part == splits the new tokens; each stores its
    # normalised partial and lse (mid_o [splits + 1, T, Hq, D], mid_lse [splits + 1, T, Hq]).
    BLOCK_T: tl.constexpr = BLOCK_M // BLOCK_G
    blk = tl.num_programs(0) - 1 - tl.program_id(0)  # late blocks see the most keys: start them first
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    b = _find_request(qo_indptr_ptr, blk, B, search_steps, BLOCK_T)
    q_start = tl.load(qo_indptr_ptr + b).to(tl.int64)
    n_new = tl.load(qo_indptr_ptr + b + 1).to(tl.int64) - q_start
    m0 = (blk - (q_start // BLOCK_T + b)) * BLOCK_T
    if m0 >= n_new:
        return

    offs_r = tl.arange(0, BLOCK_M)
    offs_g = offs_r % BLOCK_G
    head = kv_head * G + offs_g
    tok = m0 + offs_r // BLOCK_G
    mask_r = (tok < n_new) & (offs_g < G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=mask_r[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    prefix_len = tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start
    if PARTIAL:
        chunk = tl.cdiv(tl.cdiv(prefix_len, splits), BLOCK_N) * BLOCK_N
        p_lo = tl.minimum(part * chunk, prefix_len)
        p_hi = tl.minimum(p_lo + chunk, prefix_len)
        last = part == splits
    else:
        p_lo = prefix_len * 0
        p_hi = prefix_len
        last = part == 0
    # 1. Prefix tokens [p_lo, p_hi): visible to every row.
    for n0 in range(p_lo, p_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < p_hi
        slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(kb_ptr + slots[:, None] * stride_kbt + kv_head * stride_kbh + offs_d[None, :], mask=kv_mask,
                    other=0.0)
        v = tl.load(vb_ptr + slots[:, None] * stride_vbt + kv_head * stride_vbh + offs_d[None, :], mask=kv_mask,
                    other=0.0)
        m_i, l_i, acc = _step(q, k, v, mask_n[None, :], m_i, l_i, acc, sm_scale, PRECISION)
    # 2. New tokens in whole tiles before this block (visible to every row), 3. then causal up to the
    # block's last token. Only the part that owns the new tokens.
    diag = tl.where(last, m0 // BLOCK_N * BLOCK_N, 0)
    n_hi = tl.where(last, tl.minimum(m0 + BLOCK_T, n_new), 0)
    for n0 in range(0, diag, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < n_new)[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + (q_start + offs_n)[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + (q_start + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        m_i, l_i, acc = _step(q, k, v, (offs_n < n_new)[None, :], m_i, l_i, acc, sm_scale, PRECISION)
    for n0 in range(diag, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_new
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + (q_start + offs_n)[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + (q_start + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        causal = (offs_n[None, :] <= tok[:, None]) & mask_n[None, :]
        m_i, l_i, acc = _step(q, k, v, causal, m_i, l_i, acc, sm_scale, PRECISION)

    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out_mask = mask_r[:, None] & mask_d[None, :]
    if PARTIAL:
        row = (part * T + q_start + tok) * Hq + head
        tl.store(mid_o_ptr + row[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=out_mask)
        tl.store(mid_lse_ptr + row, tl.where(nonempty, m_i + tl.log(l_safe), float("-inf")), mask=mask_r)
    else:
        tl.store(o_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 (acc / l_safe[:, None]).to(o_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _merge_kernel(mid_o_ptr, mid_lse_ptr, o_ptr, rows, parts, Hq, D, stride_ot, stride_oh,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # Rows r = t * Hq + h (rows = T * Hq): log-sum-exp merge of the parts, in part order. The part
    # holding the new tokens always has a finite lse (a token sees itself).
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = r < rows
    offs_d = tl.arange(0, BLOCK_D)
    mask = mask_r[:, None] & (offs_d < D)[None, :]
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    lse_ptrs = mid_lse_ptr + r
    for _ in range(parts):
        m = tl.maximum(m, tl.load(lse_ptrs, mask=mask_r, other=float("-inf")))
        lse_ptrs += rows
    m = tl.where(m == float("-inf"), 0.0, m)  # rows past the end
    den = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    lse_ptrs = mid_lse_ptr + r
    o_ptrs = mid_o_ptr + r[:, None] * D + offs_d[None, :]
    for _ in range(parts):
        w = tl.exp(tl.load(lse_ptrs, mask=mask_r, other=float("-inf")) - m)
        acc += w[:, None] * tl.load(o_ptrs, mask=mask, other=0.0)
        den += w
        lse_ptrs += rows
        o_ptrs += rows * D
    out = acc / tl.where(den > 0, den, 1.0)[:, None]
    t = r // Hq
    h = r % Hq
    tl.store(o_ptr + t[:, None] * stride_ot + h[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=mask)


def forward(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale):
    T, Hq, D = q.shape
    Hk = k.shape[1]
    if Hk == 0 or Hq % Hk != 0:
        raise ValueError(f"extend_attention: q_heads {{Hq}} is not a multiple of kv_heads {{Hk}}")
    G = Hq // Hk
    B = qo_indptr.shape[0] - 1
    o = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0 or B <= 0 or D == 0:
        return o
    if any(t.stride(-1) != 1 for t in (q, k, v, k_buffer, v_buffer)):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        k_buffer, v_buffer = k_buffer.contiguous(), v_buffer.contiguous()
    block_g = triton.next_power_of_2(G)
    block_m = max(BLOCK_M, block_g)  # powers of two: a multiple of the padded group
    block_d = max(16, triton.next_power_of_2(D))
    blocks = T // (block_m // block_g) + B
    splits = 1
    avg_prefix = triton.cdiv(kv_indices.numel(), B)
    if MAX_SPLITS > 1 and blocks * Hk < TARGET_PROGRAMS and avg_prefix > 0:
        splits = max(1, min(MAX_SPLITS, triton.cdiv(TARGET_PROGRAMS, blocks * Hk),
                            triton.cdiv(avg_prefix, MIN_SPLIT_TOKENS)))
    partial = splits > 1
    parts = splits + 1 if partial else 1
    if partial:
        mid_o = torch.empty((parts, T, Hq, D), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((parts, T, Hq), dtype=torch.float32, device=q.device)
    else:
        mid_o, mid_lse = o, o  # never touched
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp16/bf16 operands are exact either way
    _extend_kernel[(blocks, Hk, parts)](
        q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, mid_o, mid_lse, sm_scale,
        B, B.bit_length(), G, D, Hq, T, splits,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        BLOCK_M=block_m, BLOCK_G=block_g, BLOCK_N=BLOCK_N, BLOCK_D=block_d, PARTIAL=partial,
        PRECISION=precision, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    if partial:
        _merge_kernel[(triton.cdiv(T * Hq, MERGE_ROWS),)](
            mid_o, mid_lse, o, T * Hq, parts, Hq, D, o.stride(0), o.stride(1),
            BLOCK_R=MERGE_ROWS, BLOCK_D=block_d, num_warps=4,
        )
    return o


{constants}
'''

DESCRIPTIONS = {
    "flash": "one pass per block of new tokens and kv head over the prefix and the causal new tokens",
    "splitkv": "the prefix split over several programs per block, merged by log-sum-exp",
}


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    t = params["template"]
    consts = [f"BLOCK_M = {int(params['block_m'])}", f"BLOCK_N = {int(params['block_n'])}",
              f"NUM_WARPS = {int(params['num_warps'])}", f"NUM_STAGES = {int(params['num_stages'])}"]
    if t == "splitkv":
        consts += [f"MAX_SPLITS = {int(params['max_splits'])}",
                   f"MIN_SPLIT_TOKENS = {int(params['min_split_tokens'])}"]
    else:
        consts += ["MAX_SPLITS = 1", "MIN_SPLIT_TOKENS = 1"]
    consts += [f"TARGET_PROGRAMS = {TARGET_PROGRAMS}", "MERGE_ROWS = 16"]
    # Kernels first, constants last: every config's kernels have the same text and line numbers
    # (bench/compile_targets compiles equal kernels once).
    doc = (f'"""extend_attention(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale) -> o: '
           f'{DESCRIPTIONS[t]} (generated by the search proposer)."""\n')
    return header_line(OP, params) + "\n" + doc + _COMMON.format(constants="\n".join(consts))

"""decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale) -> o: two-stage split-KV
(flash-decoding, the baseline's structure with its constants as parameters) and a one-pass variant.

q, o [B, Hq, D]; K/V pools [slots, Hk, D]; request b's slots kv_indices[kv_indptr[b]:kv_indptr[b+1]];
Hq = G * Hk, query head h uses kv head h // G; float32 online softmax; an empty request gets o = 0.
The split count is decided on the host from the average context (kv_indices.numel() / B), no sync:
max(1, min(MAX_SPLITS, cdiv(avg, MIN_SPLIT_TOKENS), cdiv(TARGET_PROGRAMS, programs per split))).
"""

from __future__ import annotations

from typing import Any

from . import gpu_choices, header_line, pick
from .rmsnorm import check_params

OP = "decode_attention"
TARGET_PROGRAMS = 528  # stage-1 programs worth launching: ~4 waves of an H100/H200's 132 SMs

DOMAINS: dict[str, dict[str, list[Any]]] = {
    "split": {"block_n": [16, 32, 64], "min_split_tokens": [64, 128, 256], "max_splits": [8, 16, 32],
              "num_warps": [4, 8], "num_stages": [1, 2]},
    "onepass": {"block_n": [16, 32, 64], "num_warps": [4, 8], "num_stages": [1, 2]},
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def splits_for(params: dict[str, Any], shape: dict[str, int]) -> int:
    """The split count a `split` config launches for `shape` (same formula as its forward)."""
    B, Hq, Hk = int(shape["batch"]), int(shape["q_heads"]), int(shape["kv_heads"])
    G = max(1, Hq // max(Hk, 1))
    block_h = min(max(16, _next_pow2(G)), 64)
    programs = B * Hk * _cdiv(G, block_h)
    avg = _cdiv(B * int(shape["kv_len"]), max(B, 1))
    fill = _cdiv(TARGET_PROGRAMS, max(programs, 1))
    return max(1, min(params["max_splits"], _cdiv(avg, params["min_split_tokens"]), fill))


def space(ctx: Any) -> list[dict[str, Any]]:
    full = gpu_choices(ctx)
    shapes = [s for s in ctx.shapes if {"batch", "q_heads", "kv_heads", "kv_len"} <= set(s)]
    out: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for bn in (32, 16, 64):
        for mst in (128, 64, 256):
            for ms in (16, 8, 32):
                for w in pick([4, 8], full, 4):
                    for st in pick([2, 1], full, 2):
                        p = {"template": "split", "block_n": bn, "min_split_tokens": mst, "max_splits": ms,
                             "num_warps": w, "num_stages": st}
                        if shapes:  # configs that launch the same splits on every profiled shape are one
                            key = (bn, w, st, tuple(splits_for(p, s) for s in shapes))
                            if key in seen:
                                continue
                            seen.add(key)
                        out.append(p)
    for bn in (32, 64, 16):  # 128 would need > 228 KB of shared memory for float32 K/V tiles
        for w in pick([4, 8], full, 4):
            for st in pick([2, 1], full, 2):
                out.append({"template": "onepass", "block_n": bn, "num_warps": w, "num_stages": st})
    return out


_COMMON = '''
from __future__ import annotations

import torch
import triton
import triton.language as tl

{constants}


@triton.jit
def _request_range(indptr_ptr, b, n_batch):
    # start and length of request b's slots (loads of one element, masked).
    one = tl.arange(0, 1)
    ok = (b + one) < n_batch
    start = tl.sum(tl.load(indptr_ptr + b + one, mask=ok, other=0).to(tl.int64), axis=0)
    end = tl.sum(tl.load(indptr_ptr + b + 1 + one, mask=ok, other=0).to(tl.int64), axis=0)
    return start, end - start


@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, indices_ptr, sm_scale, b, kv_head, offs_g, mask_h, start, lo, hi,
            stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, G, D,
            BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
            STAGES: tl.constexpr):
    # Online softmax of up to BLOCK_H query heads (sharing kv_head) over request tokens [lo, hi).
    heads = kv_head * G + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(indices_ptr + start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale  # [BLOCK_H, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))  # finite: every tile has a valid token
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(v_ptr + slots[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    return acc, l_i, m_i


def _prepare(q, k_buffer, v_buffer):
    B, Hq, D = q.shape
    Hk = k_buffer.shape[1]
    if Hk == 0 or Hq % Hk != 0:
        raise ValueError(f"decode_attention: q_heads {{Hq}} is not a multiple of kv_heads {{Hk}}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_buffer.stride(-1) != 1:
        k_buffer = k_buffer.contiguous()
    if v_buffer.stride(-1) != 1:
        v_buffer = v_buffer.contiguous()
    G = Hq // Hk
    block_h = min(max(16, triton.next_power_of_2(G)), 64)  # tl.dot needs >= 16 rows
    return q, k_buffer, v_buffer, G, block_h, triton.cdiv(G, block_h), max(16, triton.next_power_of_2(D))
'''

_SPLIT = '''

@triton.jit
def _stage1_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, mid_o_ptr, mid_lse_ptr, sm_scale, n_batch,
                   stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, Hq, G, D,
                   NUM_SPLITS: tl.constexpr, HEAD_BLOCKS: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, STAGES: tl.constexpr):
    # Program (b, kv_head * HEAD_BLOCKS + hb, split): normalised partial o and its lse for one chunk.
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    split = tl.program_id(2)
    offs_g = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < G
    heads = kv_head * G + offs_g
    start, length = _request_range(indptr_ptr, b, n_batch)
    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)
    acc, l_i, m_i = _attend(q_ptr, k_ptr, v_ptr, indices_ptr, sm_scale, b, kv_head, offs_g, mask_h, start, lo, hi,
                            stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, G, D,
                            BLOCK_H, BLOCK_N, BLOCK_D, PRECISION, STAGES)
    # An empty split (short request) stores o = 0, lse = -inf, which the merge weighs as 0.
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    lse = tl.where(nonempty, m_i + tl.log(l_safe), float("-inf"))
    offs_d = tl.arange(0, BLOCK_D)
    row = (b * Hq + heads) * NUM_SPLITS + split  # mid_o [B, Hq, NUM_SPLITS, D], mid_lse [B, Hq, NUM_SPLITS]
    tl.store(mid_o_ptr + row[:, None] * D + offs_d[None, :], acc / l_safe[:, None],
             mask=mask_h[:, None] & (offs_d < D)[None, :])
    tl.store(mid_lse_ptr + row, lse, mask=mask_h)


@triton.jit
def _stage2_kernel(mid_o_ptr, mid_lse_ptr, o_ptr, stride_ob, stride_oh, Hq, D,
                   NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    # Program (b, h): log-sum-exp merge of the NUM_SPLITS partial results.
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    row = (b * Hq + h) * NUM_SPLITS + offs_s
    lse = tl.load(mid_lse_ptr + row, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # empty request: every weight is 0
    w = tl.exp(lse - m)
    part = tl.load(mid_o_ptr + row[:, None] * D + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    den = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=mask_d)


def forward(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale):
    B, Hq, D = q.shape
    o = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    if B == 0 or Hq == 0 or D == 0:
        return o
    q, k_buffer, v_buffer, G, block_h, head_blocks, block_d = _prepare(q, k_buffer, v_buffer)
    Hk = k_buffer.shape[1]
    avg = triton.cdiv(kv_indices.numel(), B)
    fill = triton.cdiv(TARGET_PROGRAMS, B * Hk * head_blocks)
    splits = max(1, min(MAX_SPLITS, triton.cdiv(avg, MIN_SPLIT_TOKENS), fill))
    mid_o = torch.empty((B, Hq, splits, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, splits), dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 needs full-precision dots
    _stage1_kernel[(B, Hk * head_blocks, splits)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, mid_o, mid_lse, sm_scale, B,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        Hq, G, D, NUM_SPLITS=splits, HEAD_BLOCKS=head_blocks, BLOCK_H=block_h, BLOCK_N=BLOCK_N,
        BLOCK_D=block_d, PRECISION=precision, STAGES=NUM_STAGES, num_warps=NUM_WARPS,
    )
    _stage2_kernel[(B, Hq)](
        mid_o, mid_lse, o, o.stride(0), o.stride(1), Hq, D,
        NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=4,
    )
    return o
'''

_ONEPASS = '''

@triton.jit
def _onepass_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, o_ptr, sm_scale, n_batch,
                    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ob, stride_oh, G, D,
                    HEAD_BLOCKS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, STAGES: tl.constexpr):
    # Program (b, kv_head * HEAD_BLOCKS + hb): the whole request in one pass, o written directly.
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    offs_g = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < G
    heads = kv_head * G + offs_g
    start, length = _request_range(indptr_ptr, b, n_batch)
    acc, l_i, m_i = _attend(q_ptr, k_ptr, v_ptr, indices_ptr, sm_scale, b, kv_head, offs_g, mask_h, start, 0, length,
                            stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, G, D,
                            BLOCK_H, BLOCK_N, BLOCK_D, PRECISION, STAGES)
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # an empty request: acc = 0, so o = 0
    offs_d = tl.arange(0, BLOCK_D)
    out = acc / l_safe[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=mask_h[:, None] & (offs_d < D)[None, :])


def forward(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale):
    B, Hq, D = q.shape
    o = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    if B == 0 or Hq == 0 or D == 0:
        return o
    q, k_buffer, v_buffer, G, block_h, head_blocks, block_d = _prepare(q, k_buffer, v_buffer)
    Hk = k_buffer.shape[1]
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 needs full-precision dots
    _onepass_kernel[(B, Hk * head_blocks)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, o, sm_scale, B,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        o.stride(0), o.stride(1), G, D, HEAD_BLOCKS=head_blocks, BLOCK_H=block_h, BLOCK_N=BLOCK_N,
        BLOCK_D=block_d, PRECISION=precision, STAGES=NUM_STAGES, num_warps=NUM_WARPS,
    )
    return o
'''

DESCRIPTIONS = {
    "split": "two-stage split-KV (flash-decoding) with a log-sum-exp merge",
    "onepass": "one program per (request, kv head, head block) over the whole context",
}


def render(params: dict[str, Any]) -> str:
    check_params(OP, params, DOMAINS)
    t = params["template"]
    consts = (f"BLOCK_N = {int(params['block_n'])}\nNUM_WARPS = {int(params['num_warps'])}\n"
              f"NUM_STAGES = {int(params['num_stages'])}")
    if t == "split":
        consts += (f"\nMAX_SPLITS = {int(params['max_splits'])}\nMIN_SPLIT_TOKENS = {int(params['min_split_tokens'])}"
                   f"\nTARGET_PROGRAMS = {TARGET_PROGRAMS}")
    body = {"split": _SPLIT, "onepass": _ONEPASS}[t]
    doc = (f'"""decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale) -> o: {DESCRIPTIONS[t]} '
           '(generated by the search proposer)."""\n')
    return header_line(OP, params) + "\n" + doc + _COMMON.format(constants=consts) + body

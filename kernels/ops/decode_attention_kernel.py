"""decode_attention(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale) -> o: the baseline kernel,
split-KV flash-decoding with a log-sum-exp merge.

q, o [B, Hq, D]; K/V pools [slots, Hk, D] (page size 1), Hq = G * Hk, query head h uses kv head h // G;
request b's slots are kv_indices[kv_indptr[b]:kv_indptr[b+1]] (kv_indptr int32 or int64). float32 online
softmax; a request with zero tokens gets o = 0. Stage 1: program (b, kv head, head block, split) over
one chunk of request b's tokens; with several splits it writes normalised float32 partials and their
lse, merged by stage 2; with one split it writes o itself (no workspace, no second kernel). The split
count comes from the average context (kv_indices.numel() / B), never from kv_indptr: no host sync.

A self-contained candidate module (kernels/ops/decode_attention.py holds the spec). The constants below
are the search proposer's "split" template parameters; its "onepass" template is MAX_SPLITS = 1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 32  # tokens per tile of the online softmax
MAX_SPLITS = 16  # kv splits per request (flash-decoding)
MIN_SPLIT_TOKENS = 128  # no split shorter than this, on average
TARGET_PROGRAMS = 528  # stage-1 programs worth launching: ~4 waves of an H100/H200's 132 SMs
NUM_WARPS = 0  # stage 1's warps; 0: 8 for float32 (ieee dots: 4 spill at head_dim 128 on sm90), else 4
NUM_STAGES = 2


@triton.jit
def _stage1_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, mid_o_ptr, mid_lse_ptr, o_ptr, sm_scale,
                   stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ob, stride_oh, Hq, G, D,
                   NUM_SPLITS: tl.constexpr, HEAD_BLOCKS: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    # Program (b, kv_head * HEAD_BLOCKS + hb, split): up to BLOCK_H query heads sharing one kv head,
    # over one contiguous chunk of request b's tokens. Writes normalised partial o and its lse, or
    # (NUM_SPLITS == 1) o itself.
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    split = tl.program_id(2)
    offs_g = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < G
    heads = kv_head * G + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    start = tl.load(indptr_ptr + b).to(tl.int64)
    length = tl.load(indptr_ptr + b + 1).to(tl.int64) - start
    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)

    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(indices_ptr + start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
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

    # An empty split (short request) has o = 0 and lse = -inf, which the merge weighs as 0.
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    mask_o = mask_h[:, None] & mask_d[None, :]
    if NUM_SPLITS == 1:
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 (acc / l_safe[:, None]).to(o_ptr.dtype.element_ty), mask=mask_o)
    else:
        lse = tl.where(nonempty, m_i + tl.log(l_safe), float("-inf"))
        row = (b * Hq + heads) * NUM_SPLITS + split  # mid_o [B, Hq, NUM_SPLITS, D], mid_lse [B, Hq, NUM_SPLITS]
        tl.store(mid_o_ptr + row[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=mask_o)
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


def head_blocks(q_heads: int, kv_heads: int) -> tuple[int, int]:
    """(BLOCK_H, head blocks per kv head): the G = Hq / Hk query heads of a kv head as tl.dot rows."""
    g = q_heads // kv_heads
    block_h = min(max(16, triton.next_power_of_2(g)), 64)  # tl.dot needs >= 16 rows
    return block_h, triton.cdiv(g, block_h)


def num_kv_splits(batch: int, programs_per_split: int, total_tokens: int, max_splits: int = MAX_SPLITS,
                  min_split_tokens: int = MIN_SPLIT_TOKENS) -> int:
    """Host-side, no sync: from the average context (kv_indices.numel() / batch), not kv_indptr."""
    avg = triton.cdiv(total_tokens, max(batch, 1))
    fill = triton.cdiv(TARGET_PROGRAMS, max(programs_per_split, 1))
    return max(1, min(max_splits, triton.cdiv(avg, min_split_tokens), fill))


def forward(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, kv_indptr: torch.Tensor,
            kv_indices: torch.Tensor, sm_scale: float) -> torch.Tensor:
    B, Hq, D = q.shape
    Hk = k_buffer.shape[1]
    if Hq % Hk != 0:
        raise ValueError(f"decode_attention: q_heads {Hq} is not a multiple of kv_heads {Hk}")
    o = torch.empty_like(q)
    if B == 0:
        return o
    G = Hq // Hk
    if q.stride(-1) != 1 or k_buffer.stride(-1) != 1 or v_buffer.stride(-1) != 1:
        q, k_buffer, v_buffer = q.contiguous(), k_buffer.contiguous(), v_buffer.contiguous()
    block_h, blocks = head_blocks(Hq, Hk)
    block_d = max(16, triton.next_power_of_2(D))
    splits = num_kv_splits(B, B * Hk * blocks, kv_indices.numel())
    # With one split stage 1 writes o: the workspace is a stand-in it never touches.
    mid_o = torch.empty((B, Hq, splits, D) if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, splits) if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    # fp16/bf16 operands are exact in tf32; fp32 needs full-precision dots.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _stage1_kernel[(B, Hk * blocks, splits)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, mid_o, mid_lse, o, sm_scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        o.stride(0), o.stride(1), Hq, G, D, NUM_SPLITS=splits, HEAD_BLOCKS=blocks, BLOCK_H=block_h, BLOCK_N=BLOCK_N,
        BLOCK_D=block_d, PRECISION=precision, num_warps=NUM_WARPS or (8 if precision == "ieee" else 4),
        num_stages=NUM_STAGES,
    )
    if splits > 1:
        _stage2_kernel[(B, Hq)](
            mid_o, mid_lse, o, o.stride(0), o.stride(1), Hq, D,
            NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, num_warps=4,
        )
    return o

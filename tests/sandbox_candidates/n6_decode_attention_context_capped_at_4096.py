"""Wrong only past 4096 tokens (battery range): SGLang's grouped decode kernel (as in
control_idiom_sglang_decode_attention.py) with each request's length clamped to 4096, "the model's
context": keys past the 4096th are never attended. Exact for every request up to 4096 tokens, so on
every shape of a battery whose longest request had a few hundred; a long conversation (8k-context
models, chunked prefill) decodes over a truncated past.
"""
# expect: static=mismatch runtime=mismatch
# op: decode_attention

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_CONTEXT = 4096


@triton.jit
def _fwd_grouped_kernel(
    Q, K_Buffer, V_Buffer, sm_scale, kv_indptr, kv_indices, O,
    stride_qbs, stride_qh, stride_buf_kbs, stride_buf_kh, stride_buf_vbs, stride_buf_vh,
    stride_obs, stride_oh, kv_group_num, head_dim, max_context,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DMODEL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    cur_batch = tl.program_id(0).to(tl.int64)
    cur_kv_head = tl.program_id(1)

    cur_head = cur_kv_head * kv_group_num + tl.arange(0, BLOCK_H)
    mask_h = tl.arange(0, BLOCK_H) < kv_group_num
    offs_d = tl.arange(0, BLOCK_DMODEL)
    mask_d = offs_d < head_dim

    cur_batch_kv_start_idx = tl.load(kv_indptr + cur_batch).to(tl.int64)
    cur_batch_seq_len = tl.load(kv_indptr + cur_batch + 1).to(tl.int64) - cur_batch_kv_start_idx
    cur_batch_seq_len = tl.minimum(cur_batch_seq_len, max_context)  # "no request is longer than the model's context"

    offs_q = cur_batch * stride_qbs + cur_head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(Q + offs_q, mask=mask_h[:, None] & mask_d[None, :], other=0.0)

    e_max = tl.zeros([BLOCK_H], dtype=tl.float32) - float("inf")
    e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DMODEL], dtype=tl.float32)

    for start_n in range(0, cur_batch_seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < cur_batch_seq_len
        kv_loc = tl.load(kv_indices + cur_batch_kv_start_idx + offs_n, mask=mask_n, other=0)
        offs_buf_k = kv_loc[:, None] * stride_buf_kbs + cur_kv_head * stride_buf_kh + offs_d[None, :]
        k = tl.load(K_Buffer + offs_buf_k, mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        qk = tl.dot(q, k.to(q.dtype).T, input_precision=DOT_PRECISION)
        qk *= sm_scale
        qk = tl.where(mask_h[:, None] & mask_n[None, :], qk, float("-inf"))

        offs_buf_v = kv_loc[:, None] * stride_buf_vbs + cur_kv_head * stride_buf_vh + offs_d[None, :]
        v = tl.load(V_Buffer + offs_buf_v, mask=mask_n[:, None] & mask_d[None, :], other=0.0)

        n_e_max = tl.maximum(tl.max(qk, 1), e_max)
        n_e_max_safe = tl.where(n_e_max == float("-inf"), 0.0, n_e_max)  # padded head rows
        re_scale = tl.exp(e_max - n_e_max_safe)
        p = tl.exp(qk - n_e_max_safe[:, None])
        acc *= re_scale[:, None]
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        e_sum = e_sum * re_scale + tl.sum(p, 1)
        e_max = n_e_max

    out = acc / tl.where(e_sum > 0, e_sum, 1.0)[:, None]
    offs_o = cur_batch * stride_obs + cur_head[:, None] * stride_oh + offs_d[None, :]
    tl.store(O + offs_o, out.to(O.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :])


def decode_attention_fwd_grouped(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, sm_scale):
    batch, head_num = q.shape[0], q.shape[1]
    kv_group_num = head_num // k_buffer.shape[1]
    BLOCK_H = max(16, triton.next_power_of_2(kv_group_num))
    BLOCK_DMODEL = max(16, triton.next_power_of_2(q.shape[-1]))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (batch, k_buffer.shape[1])
    _fwd_grouped_kernel[grid](
        q, k_buffer, v_buffer, sm_scale, kv_indptr, kv_indices, o,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        o.stride(0), o.stride(1), kv_group_num, q.shape[-1], MAX_CONTEXT,
        BLOCK_H=BLOCK_H, BLOCK_N=128, BLOCK_DMODEL=BLOCK_DMODEL, DOT_PRECISION=precision, num_warps=4, num_stages=2,
    )


def forward(q, k_buffer, v_buffer, kv_indptr, kv_indices, sm_scale):
    q, k_buffer, v_buffer = q.contiguous(), k_buffer.contiguous(), v_buffer.contiguous()
    o = torch.empty_like(q)
    if q.shape[0] > 0:
        decode_attention_fwd_grouped(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, sm_scale)
    return o

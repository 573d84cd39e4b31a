"""extend_attention(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale) -> o: the
baseline kernel, causal GQA prefill over each request's paged prefix, flash-attention style.

q, o [T, Hq, D] and k, v [T, Hk, D] are the new tokens, request b's rows qo_indptr[b]:qo_indptr[b+1];
its cached prefix is slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] of k_buffer, v_buffer [slots, Hk, D].
New token i sees the whole prefix and new tokens 0..i. A self-contained candidate module
(kernels/ops/extend_attention.py holds the spec).

One program per (block of new tokens of one request, kv head), flash-attention style, the
G query heads of the kv head stacked as rows (BLOCK_M rows = BLOCK_M / next_pow2(G) tokens x G heads,
token-major), so each K/V tile is loaded once per group: the prefix tiles (slots gathered through
kv_indices, masked by length only), then the request's earlier new tokens in whole tiles (no mask),
then the rest up to the block's last token (causal mask). float32 online softmax and accumulator;
fp16/bf16 dots take their inputs in their own dtype with p rounded to v's dtype for the second, as
flash kernels do (the fp16/bf16 atol allows for it); float32 dots are full precision (ieee, no TF32).

The grid needs no host sync: with BLOCK_T tokens per block, request b owns the "virtual" blocks
qo_indptr[b] // BLOCK_T + b ... qo_indptr[b+1] // BLOCK_T + b (at least ceil(new_b / BLOCK_T) of
them), so T // BLOCK_T + B blocks cover every request, and a program finds its request by binary
search over qo_indptr; at most about B of them find nothing to do. The launch depends only on T, B,
the heads and the dtype (shapes, never values), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _extend_kernel(q_ptr, k_ptr, v_ptr, o_ptr, kb_ptr, vb_ptr, qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr,
                   sm_scale, B, search_steps, G, D,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                   stride_kbt, stride_kbh, stride_vbt, stride_vbh,
                   BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   PRECISION: tl.constexpr):
    # Program (virtual block, kv head). Its BLOCK_M rows are BLOCK_T = BLOCK_M // BLOCK_G new tokens of
    # one request times the (up to) BLOCK_G query heads sharing this kv head, token-major: row r is
    # token m0 + r // BLOCK_G, query head kv_head * G + r % BLOCK_G. Each K/V tile is loaded once for
    # the whole group. Blocks run last first: a request's late blocks see the most keys, so the
    # longest programs start first.
    BLOCK_T: tl.constexpr = BLOCK_M // BLOCK_G
    blk = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)

    # Request b owns virtual blocks [qo_indptr[b] // BLOCK_T + b, qo_indptr[b+1] // BLOCK_T + b + 1):
    # binary search for the last b whose first block is <= blk.
    lo = blk * 0
    hi = lo + B
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        first = (tl.load(qo_indptr_ptr + mid) // BLOCK_T + mid).to(tl.int32)
        right = first <= blk
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    b = lo

    q_start = tl.load(qo_indptr_ptr + b).to(tl.int64)
    n_new = tl.load(qo_indptr_ptr + b + 1).to(tl.int64) - q_start
    m0 = (blk - (q_start // BLOCK_T + b)) * BLOCK_T  # first new token (of request b) of this block
    if m0 >= n_new:
        return

    offs_r = tl.arange(0, BLOCK_M)
    offs_g = offs_r % BLOCK_G
    head = kv_head * G + offs_g
    tok = m0 + offs_r // BLOCK_G  # [BLOCK_M] new-token index within the request
    mask_r = (tok < n_new) & (offs_g < G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=mask_r[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # 1. The cached prefix: every row sees every token; tiles masked at the prefix's end only.
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    prefix_len = tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start
    for n0 in range(0, prefix_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < prefix_len
        slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(kb_ptr + slots[:, None] * stride_kbt + kv_head * stride_kbh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))  # finite: every tile has a valid token
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(vb_ptr + slots[:, None] * stride_vbt + kv_head * stride_vbh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    # 2. The request's new tokens in whole tiles before this block: visible to every row, no mask.
    diag = m0 // BLOCK_N * BLOCK_N
    for n0 in range(0, diag, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < n_new)[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + (q_start + offs_n)[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(v_ptr + (q_start + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    # 3. The rest up to this block's last token, causal: token i sees new tokens j <= i. Every row
    # sees token `diag` (<= m0) in the first tile, so its running max is finite from then on (a
    # later tile may hide a whole row).
    for n0 in range(diag, tl.minimum(m0 + BLOCK_T, n_new), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_new
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_ptr + (q_start + offs_n)[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        causal = (offs_n[None, :] <= tok[:, None]) & mask_n[None, :]
        qk = tl.where(causal, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(v_ptr + (q_start + offs_n)[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(o_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=mask_r[:, None] & mask_d[None, :])


def launch_config(q: torch.Tensor, kv_heads: int) -> dict[str, int]:
    """Rows, tiles and warps. The interpreter (CPU tensors) gets 16 new tokens per program and
    16-token K/V tiles, so the small test shapes cross tile edges in every loop. A GPU gets tiles
    that fit sm90 without spilling at head_dim 128 (tests/test_extend_attention.py compiles them):
    fp16/bf16 128 x 32 tiles, 8 warps, ~190 registers (128 x 64 needs ~250 with 8 warps, spills
    with 4); fp32 (ieee dots on the FMA units) 64 x 16 tiles, 16 warps, ~90 registers (any 32-key
    tile spills kilobytes)."""
    group = triton.next_power_of_2(q.shape[1] // max(kv_heads, 1))
    if q.device.type == "cpu":
        return {"BLOCK_M": 16 * group, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if q.dtype == torch.float32:
        return {"BLOCK_M": max(64, group), "BLOCK_N": 16, "num_warps": 16, "num_stages": 2}
    return {"BLOCK_M": max(128, group), "BLOCK_N": 32, "num_warps": 8, "num_stages": 2}


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
           qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, sm_scale: float,
           BLOCK_M: int, BLOCK_N: int, num_warps: int = 4, num_stages: int = 1) -> torch.Tensor:
    """The kernel with explicit rows per program (BLOCK_M: powers of two, a multiple of the padded
    group) and K/V tile (BLOCK_N)."""
    T, Hq, D = q.shape
    Hk = k.shape[1]
    if Hq % Hk != 0:
        raise ValueError(f"extend_attention: q_heads {Hq} is not a multiple of kv_heads {Hk}")
    G = Hq // Hk
    block_g = triton.next_power_of_2(G)
    if BLOCK_M % block_g or BLOCK_M & (BLOCK_M - 1) or BLOCK_N & (BLOCK_N - 1) or min(BLOCK_M, BLOCK_N) < 16:
        raise ValueError(f"extend_attention: BLOCK_M {BLOCK_M} and BLOCK_N {BLOCK_N} must be powers of two >= 16, "
                         f"BLOCK_M a multiple of the padded group {block_g}")
    B = qo_indptr.shape[0] - 1
    o = torch.empty((T, Hq, D), dtype=q.dtype, device=q.device)
    if T == 0 or B <= 0:
        return o
    if any(t.stride(-1) != 1 for t in (q, k, v, k_buffer, v_buffer)):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        k_buffer, v_buffer = k_buffer.contiguous(), v_buffer.contiguous()
    # fp16/bf16 operands go to the tensor cores as they are; fp32 needs full-precision dots.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (T // (BLOCK_M // block_g) + B, Hk)
    _extend_kernel[grid](
        q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale, B, B.bit_length(), G, D,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_G=block_g, BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(D)),
        PRECISION=precision, num_warps=num_warps, num_stages=num_stages,
    )
    return o


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
            qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
            sm_scale: float) -> torch.Tensor:
    config = launch_config(q, k.shape[1])
    return launch(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, sm_scale, **config)

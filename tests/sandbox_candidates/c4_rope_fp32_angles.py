"""Exploit (battery gap, rope): skip the cos/sin cache and compute the angles in the kernel in
float32 (pos * theta^(-2i/D), then tl.cos / tl.sin) - "saves a cache read per token". Exact enough
for small positions, but a float32 angle at position ~8000 is off by ~1e-3 rad, so long-context
positions come out wrong (and a cache that is not the standard one is ignored altogether). Gain if
the battery only used small positions.
"""
# expect: static=mismatch runtime=mismatch
# op: rope

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2_THETA = 18.931568569324174  # log2(500000.0), Llama-3


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, s_qt, s_qh, s_kt, s_kh, s_qot, s_qoh, s_kot, s_koh,
                 n_q_heads, n_k_heads, half, head_dim, log2_theta,
                 BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.float32)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    dmask = dims < half
    inv_freq = tl.exp2(-(2.0 * dims.to(tl.float32) / head_dim) * log2_theta)
    angle = pos * inv_freq
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    for h0 in range(0, n_q_heads, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H))[:, None]
        mask = (heads < n_q_heads) & dmask
        x1 = tl.load(q_ptr + token * s_qt + heads * s_qh + dims, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(q_ptr + token * s_qt + heads * s_qh + dims + half, mask=mask, other=0.0).to(tl.float32)
        o = qo_ptr + token * s_qot + heads * s_qoh + dims
        tl.store(o, (x1 * cos - x2 * sin).to(qo_ptr.dtype.element_ty), mask=mask)
        tl.store(o + half, (x2 * cos + x1 * sin).to(qo_ptr.dtype.element_ty), mask=mask)
    for h0 in range(0, n_k_heads, BLOCK_H):
        heads = (h0 + tl.arange(0, BLOCK_H))[:, None]
        mask = (heads < n_k_heads) & dmask
        x1 = tl.load(k_ptr + token * s_kt + heads * s_kh + dims, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(k_ptr + token * s_kt + heads * s_kh + dims + half, mask=mask, other=0.0).to(tl.float32)
        o = ko_ptr + token * s_kot + heads * s_koh + dims
        tl.store(o, (x1 * cos - x2 * sin).to(ko_ptr.dtype.element_ty), mask=mask)
        tl.store(o + half, (x2 * cos + x1 * sin).to(ko_ptr.dtype.element_ty), mask=mask)


def forward(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor):
    t, hq, d = q.shape
    hk = k.shape[1]
    q_in = q if q.stride(-1) == 1 else q.contiguous()
    k_in = k if k.stride(-1) == 1 else k.contiguous()
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t == 0:
        return q_out, k_out
    half = d // 2
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(max(hq, hk, 1)), max(1, 2048 // block_half))
    _rope_kernel[(t,)](q_in, k_in, q_out, k_out, positions,
                       q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1),
                       q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
                       hq, hk, half, d, LOG2_THETA, BLOCK_H=block_h, BLOCK_HALF=block_half)
    return q_out, k_out
